// Package natsbackend is the NATS JetStream broker of package backends.
// Imported for its side effect, it registers
// nats://[user:pass@]host:4222[,host2:4222]:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
//
// It links watermill-nats and nats.go.
//
// # Parameters
//
//	nats://localhost:4222?ack_wait=60s&max_ack_pending=100
//
// ack_wait (60 s) is how long the server waits for an ack or a progress
// ack before it redelivers. Keep it above the idempotency lease (40 s):
// backends.Config.CheckLease checks it. max_ack_pending (100) caps the
// unacked messages of a group on a topic; keep it small.
// backends.Config.Tune receives each *nats.Options, for credentials files
// and TLS.
//
// # What it sets
//
// Each topic is a subject captured by a stream: the operator's, or one the
// backend creates with JetStream's defaults. Publishes carry no
// Nats-Msg-Id: a requeued message (same UUID) is delivered again. A
// message whose metadata sets one and that JetStream drops is
// backends.ErrDuplicatePublish.
//
// Each group reads a topic through a durable push consumer, group_topic,
// which the backend creates. Acks are manual and explicit: nats.go would
// otherwise ack before the handler runs, and a crash would lose the
// message. The durable survives every shutdown, with the group's position.
// Delete it (nats consumer rm) when a group is retired.
//
// # Failures
//
// A nacked message is redelivered by the server after NackResendSleep
// (NakWithDelay). The messages behind it go on.
//
// A progress ack on receipt and every ack_wait/3 keeps a slow handler's
// message. Only a dead consumer's message, or one that waited in the client
// longer than ack_wait, comes back. Reconnects never give up.
//
// A header with several values reaches the handler joined with ", ".
//
// A running subscriber checks every 5 s that its durable exists. When the
// stream or the durable was deleted, it creates them again and subscribes
// anew. docs/GUARANTEES.md ("Brokers") has what is delivered then.
// On Close a message held but not acked is nacked at once.
package natsbackend
