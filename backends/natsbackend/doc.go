// Package natsbackend is the NATS JetStream broker of package backends.
// Imported for its side effect, it registers
// nats://[user:pass@]host:4222[,host2:4222]. It links watermill-nats and
// nats.go.
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
//
// # Parameters
//
//	nats://localhost:4222?ack_wait=60s&max_ack_pending=100
//
// Package backends lists the parameters; keep max_ack_pending small.
// backends.Config.Tune receives each *nats.Options, for credentials files
// and TLS.
//
// # What it sets
//
// Each topic is a subject captured by a stream: the operator's, or one the
// backend creates with JetStream's defaults. Publishes carry no
// Nats-Msg-Id, so a requeued message (same UUID) is delivered again; one
// whose metadata sets it and that JetStream drops is
// backends.ErrDuplicatePublish.
//
// Each group reads a topic through a durable push consumer, group_topic,
// which the backend creates, with manual, explicit acks. The durable keeps
// the group's position across shutdowns; delete it (nats consumer rm) when
// a group is retired.
//
// # Failures
//
// A nacked message is redelivered after NackResendSleep (NakWithDelay);
// the messages behind it go on. A progress ack on receipt and every
// ack_wait/3 keeps a slow handler's message: only a dead consumer's, or
// one that waited in the client longer than ack_wait, comes back.
// Reconnects never give up. A header with several values reaches the
// handler joined with ", ". On Close a held message is nacked at once.
//
// A running subscriber checks every 5 s that its durable exists, and
// creates the stream and durable again if deleted. docs/GUARANTEES.md
// ("Brokers") has what is delivered then.
package natsbackend
