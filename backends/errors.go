package backends

import "github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"

// Errors of [New], [Config.Validate], [FromEnv] and the Publishers, wrapped;
// check them with [errors.Is].
var (
	// ErrInvalidConfig is what no retry mends: a bad URL, a broker not
	// linked, a missing group, a field out of range, or a refused connection.
	ErrInvalidConfig = brokerkit.ErrInvalidConfig
	// ErrUnreachable is a broker that did not answer within DialTimeout, or
	// cannot serve yet. A retry may succeed.
	ErrUnreachable = brokerkit.ErrUnreachable
	// ErrUnroutable is an AMQP publish that no queue received.
	ErrUnroutable = brokerkit.ErrUnroutable
	// ErrDuplicatePublish is a NATS publish JetStream dropped: the metadata
	// set a Nats-Msg-Id the stream holds.
	ErrDuplicatePublish = brokerkit.ErrDuplicatePublish
)

// MetadataUndecodable is the metadata key set on a message not decoded in
// full; its value says what was left out. The message still reaches the
// handler. Only Redis Streams sets it, for metadata that is not msgpack.
const MetadataUndecodable = brokerkit.MetadataUndecodable
