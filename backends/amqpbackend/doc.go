// Package amqpbackend is the AMQP (RabbitMQ) broker of package backends.
// Imported for its side effect, it registers amqp://user:pass@host:5672/vhost
// and amqps:// for TLS:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/amqpbackend"
//
// It links watermill-amqp and amqp091-go. A program that does not import it
// links neither.
//
// # Parameters
//
//	amqp://guest:guest@localhost:5672/?prefetch=1&publish_groups=billing,audit
//
// prefetch (1) is how many unacked messages each subscription holds.
// publish_groups (none) lists the groups whose queues the publisher
// declares and binds at every publish. amqp091 URI options pass through
// but connection_timeout: backends.Config.DialTimeout bounds the dial. Any
// other parameter is refused. backends.Config.Tune receives each
// *amqp091.Config.
//
// # What it sets
//
// Each topic is a durable fanout exchange of its name. Each topic and group
// has a durable queue bound to it, named topic_group. '%' and '_' in the
// group are written %25 and %5F, so no two pairs share a queue. A name past
// 238 bytes is cut and ends in a hash. The consumers of a group compete for
// its queue; each group's queue gets every message.
//
// Messages are persistent and confirmed: Publish returns once RabbitMQ has
// the message. Publishes are mandatory. A message no queue receives is
// returned, and Publish is backends.ErrUnroutable, never a silent drop.
//
// # Publishing before the consumers
//
// RabbitMQ keeps messages only in queues. A group's queue exists from its
// first subscribe, or SubscribeInitialize. Until then a publish to the
// topic is backends.ErrUnroutable: outputs and poison topics too. List the
// consuming groups in publish_groups, or call SubscribeInitialize once.
//
// publish_groups belongs to the publishing process, not to a topic. It
// declares each listed group's queue on every topic the process publishes
// to, and re-creates a deleted one before the next message. That costs
// about 8% of a publish. A listed group's queue of a topic it never consumes
// fills without bound.
//
// # Failures
//
// A nacked message is held for NackResendSleep, then requeued at the head
// of the queue. A consumer's messages are requeued at once when its
// connection drops. A dropped connection is redialled with backoff. A
// running consumer whose queue is deleted subscribes again and declares it.
//
// A header that is not a string reaches the handler formatted with %v. The
// library nacked such a message in an endless loop.
//
// A wrong password, a virtual host the user cannot open, or amqps:// to a
// port without TLS is backends.ErrInvalidConfig. A virtual host or user at
// its connection limit is backends.ErrUnreachable. RabbitMQ closes the
// connection of a wrong password about 3 s late: with a DialTimeout under
// 3 s, New reports it as backends.ErrUnreachable.
package amqpbackend
