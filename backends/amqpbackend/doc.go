// Package amqpbackend is the AMQP (RabbitMQ) broker of package backends.
// Imported for its side effect, it registers amqp://user:pass@host:5672/vhost
// and amqps:// for TLS. It links watermill-amqp and amqp091-go.
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/amqpbackend"
//
// # Parameters
//
//	amqp://guest:guest@localhost:5672/?prefetch=1&publish_groups=billing,audit
//
// Package backends lists the parameters. amqp091 URI options pass through
// but connection_timeout (backends.Config.DialTimeout bounds the dial); any
// other is refused. backends.Config.Tune receives each *amqp091.Config.
//
// # What it sets
//
// Each topic is a durable fanout exchange of its name, with a durable queue
// per group, topic_group ('%' and '_' in the group written %25 and %5F; a
// name past 238 bytes cut and hashed). A group's consumers compete for its
// queue. Messages are persistent, confirmed and mandatory: one no queue
// receives is backends.ErrUnroutable, never a silent drop.
//
// A group's queue exists from its first subscribe or SubscribeInitialize;
// until then a publish to the topic is backends.ErrUnroutable, outputs and
// poison topics too. List the groups in publish_groups, or call
// SubscribeInitialize once. publish_groups declares each listed group's
// queue on every topic the process publishes to, at about 8% of a publish;
// one of a topic the group never consumes fills without bound.
//
// # Failures
//
// A nacked message is held for NackResendSleep, then requeued at the head
// of the queue. A dropped connection requeues its messages at once and is
// redialled with backoff. A consumer whose queue is deleted declares it and
// subscribes again. A header that is not a string reaches the handler
// formatted with %v.
//
// A wrong password, a virtual host the user cannot open, or amqps:// to a
// port without TLS is backends.ErrInvalidConfig; a connection limit is
// backends.ErrUnreachable. RabbitMQ refuses a wrong password about 3 s
// late: under a 3 s DialTimeout it is backends.ErrUnreachable.
package amqpbackend
