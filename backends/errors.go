package backends

import "github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"

// Errors of [New], [Config.Validate], [FromEnv] and the Publishers. They are
// wrapped with what went wrong; check them with [errors.Is].
var (
	// ErrInvalidConfig is a Config that no retry mends. That is a bad or
	// unknown URL, a broker the program does not link, a missing group, or
	// a field out of range. It is also a broker that refuses the
	// connection: wrong credentials, a missing database or virtual host.
	ErrInvalidConfig = brokerkit.ErrInvalidConfig
	// ErrUnreachable is a broker that did not answer within
	// Config.DialTimeout, or answered that it cannot serve yet. The same
	// Config may succeed once the broker is up.
	ErrUnreachable = brokerkit.ErrUnreachable
	// ErrUnroutable is an AMQP publish that no queue received: no group
	// has subscribed to the topic yet, and none is in publish_groups.
	ErrUnroutable = brokerkit.ErrUnroutable
	// ErrDuplicatePublish is a NATS publish that JetStream dropped. The
	// message's metadata set a Nats-Msg-Id that the stream already holds.
	ErrDuplicatePublish = brokerkit.ErrDuplicatePublish
)

// MetadataUndecodable is the metadata key set on a message that could not
// be decoded in full. Its value says what was left out. The message still
// reaches the handler, which, with the idempotency middleware or a
// PoisonQueue, decides its fate. Only Redis Streams sets it, for an entry
// whose metadata is not the msgpack map Watermill writes.
const MetadataUndecodable = brokerkit.MetadataUndecodable
