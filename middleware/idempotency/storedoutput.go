package idempotency

import "github.com/ThreeDotsLabs/watermill/message"

// DecodeOutput decodes the Result of a COMPLETED record written by the
// Watermill middleware, for tools that inspect records (cmd/idemctl): the
// messages its handler produced, with their UUIDs, metadata and payloads
// (stored true), or stored false when the output was not kept (larger than
// OnceConfig.MaxOutputSize, or Config.DisableOutputReplay). An empty result is
// no output. An error means result is not an output the middleware wrote:
// a response stored by httpidem, a value stored by Once.Do, or a corrupt
// one.
func DecodeOutput(result []byte) (msgs []*message.Message, stored bool, err error) {
	return decodeOutput(result)
}
