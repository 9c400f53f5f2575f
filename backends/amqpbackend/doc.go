// Package amqpbackend is the AMQP (RabbitMQ) broker of package backends.
// Imported for its side effect, it registers the broker, and backends.New
// then builds a Publisher and Subscriber for
// amqp://user:pass@host:5672/vhost (amqps:// for TLS):
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/amqpbackend"
//
// It links watermill-amqp and amqp091-go, which a program that does not
// import it does without; New refuses an amqp:// URL there with
// backends.ErrBrokerNotLinked.
//
// The settings named below (Group, Consumer, NackResendSleep and the AMQP
// section) are fields of backends.Config, which holds every broker's
// settings so that one Config, and backends.FromEnv, serves them all.
//
// watermill-amqp on its durable pub/sub topology: a durable fanout exchange
// per topic and a durable queue per topic and group, bound to it. The
// exchange is named after the topic. The queue is topic_group, with '%' and
// '_' in the group written %25 and %5F, so that no two pairs share a queue:
// topic X_eu with group billing is X_eu_billing, topic X with group
// eu_billing X_eu%5Fbilling. A name past 238 bytes is cut to 238 and ends
// in '_' and 16 hex digits of a hash of what it names (RabbitMQ takes 255),
// so that a cut name is never another's whole name. The
// consumers of a group compete for their queue; each group's queue gets
// every message. Messages are published persistent and with
// publisher confirms: Publish returns only once RabbitMQ has taken the
// message. Each subscription has Prefetch (1) unacked messages at most.
//
// Publishes are mandatory: a fanout exchange discards what no queue is bound
// to, and RabbitMQ still confirms it, so without mandatory a message
// published before any group subscribed, or after a group's queue was
// deleted, was lost while Publish returned nil. RabbitMQ returns such a
// message instead, and Publish returns backends.ErrUnroutable. A group's queue exists
// from the first time one of its subscribers subscribes (or calls
// SubscribeInitialize). A service that publishes before its consumers first
// start lists their groups in AMQP.PublishGroups: the publisher declares and
// binds their queues at every publish (about 8% of a confirmed publish's
// time), so a listed group's deleted queue is back before the next message,
// even while another group's queue takes the message and keeps mandatory
// from noticing. By default the publisher declares no queue: it used to
// declare its own group's queue for every topic it published to, and the
// queue of an output topic that the group never consumed filled without
// bound.
//
// So every topic a process publishes to needs a queue first, outputs and
// poison topics too. Watermill's PoisonQueue middleware gets
// backends.ErrUnroutable from its publish while no queue is bound to the
// poison topic: the message is nacked and redelivered instead of moved.
// AMQP.PublishGroups belongs to the publishing process, not to a topic:
// every process that may publish first needs the list, and its publisher
// declares a queue of each listed group on every topic the process
// publishes to, consumed by that group or not. Where the groups differ by
// topic, create each queue once instead: a subscriber of the group calls
// SubscribeInitialize(topic).
//
// A running consumer whose queue is deleted subscribes again at once,
// declaring the queue anew (watermill-amqp handed the handler an empty
// message first; the backend stops that). A group that is not listed in
// PublishGroups and whose queue is deleted while none of its consumers runs
// misses what is published meanwhile if another group's queue receives it.
//
// A wrong user name or password, a virtual host the user cannot open, or
// amqps:// to a port that does not speak TLS, is a backends.ErrInvalidConfig
// from New; a virtual host or user at its
// connection limit is an ErrUnreachable (but over amqps, where the backend
// cannot read RabbitMQ's reason for closing). RabbitMQ closes the connection of a
// wrong password about 3 s after it, and amqp091 cannot tell that from a
// handshake that ran out of time: with a DialTimeout under 3 s, New reports
// ErrUnreachable for it.
//
// RabbitMQ requeues a nacked message to the head of the queue at once; the
// subscriber holds the nack for NackResendSleep first. A message held by a
// consumer whose connection drops is requeued by RabbitMQ at once. A dropped
// connection is redialled with exponential backoff.
package amqpbackend
