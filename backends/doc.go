// Package backends builds a Watermill Publisher and Subscriber for the
// broker that one URL names. A service moves to another broker by changing
// BROKER_URL alone:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/all" // or only the brokers used
//
//	cfg, err := backends.FromEnv() // BROKER_URL, BROKER_GROUP, ...
//	b, err := backends.New(cfg, logger) // ErrInvalidConfig: fix it; ErrUnreachable: retry
//	router.AddHandler("bill", "orders", b.Subscriber, "invoices", b.Publisher, bill)
//
// # Broker URLs
//
//	kafka://host:9092[,host2:9092]
//	redis://[user:pass@]host:6379/0      rediss:// for TLS
//	amqp://user:pass@host:5672/vhost     amqps:// for TLS
//	nats://[user:pass@]host:4222[,host2:4222]
//	gochannel://
//
// The query holds the broker's parameters, which the backend takes out; the
// client library's URL options pass through. A zero value is the default.
//
//	broker  parameter           default    meaning
//	kafka   partitions          12         partitions of the topics it creates
//	kafka   replication_factor  min(3, n)  their replication, n the cluster's brokers
//	kafka   version             2.1.0      the lowest Kafka version of the cluster
//	redis   max_idle_time       60s        XCLAIM a message unacked this long
//	redis   claim_interval      5s         how often to look for such messages
//	redis   maxlen              none       XADD MAXLEN ~ on each stream
//	amqp    prefetch            1          unacked messages per subscription
//	amqp    publish_groups      none       groups whose queues each publish declares
//	nats    ack_wait            60s        redeliver a message unacked this long
//	nats    max_ack_pending     100        unacked messages per group and topic
//
// Keep max_idle_time and ack_wait above the idempotency lease (40 s);
// [Config.CheckLease] checks it.
//
// # Linking brokers
//
// Each broker but gochannel is a package that registers it when imported,
// as database/sql drivers do: kafkabackend, redisbackend, amqpbackend,
// natsbackend, or all of them in backends/all. A program links only the
// clients it imports. A URL of a broker not linked is an [ErrInvalidConfig]
// naming the import; [Config.Tune] takes any client configuration.
//
// # Guarantees
//
// Every backend delivers at least once: a message is acked only after the
// handler acked it, and one never settled comes back. Subscribers sharing
// [Config.Group] divide a topic's messages; each group gets every message
// ([Backend.SubscriberForGroup] for a further handler). A new group starts
// at the oldest message held (on AMQP, when its queue is declared). A
// nacked message comes back after [Config.NackResendSleep], not at once.
//
// [New] connects before it returns: no answer within [Config.DialTimeout]
// is an [ErrUnreachable]; a refusal (a wrong password, a missing virtual
// host) is an [ErrInvalidConfig]. Errors show a URL's scheme and host
// alone, never its user information, path or query.
//
// Every backend replaces the library defaults that lose or duplicate
// messages; docs/GUARANTEES.md ("Brokers") has each, and how brokers treat
// a requeued, unroutable, undecodable, slow or failing message. An AMQP
// publish no queue receives is an [ErrUnroutable]; a NATS publish dropped
// as a duplicate an [ErrDuplicatePublish]; a Redis Streams entry whose
// metadata does not decode has [MetadataUndecodable] set. A failing message
// comes back for ever unless MaxAttempts or a PoisonQueue stops it.
//
// The Publisher and each Subscriber own their connection. A router closes
// them when it stops; [Backend.Close] does it without one. Close is idempotent.
//
// # gochannel
//
// One in-process, persistent GoChannel is both Publisher and Subscriber,
// for tests and demos. A late subscriber gets what was published before;
// every message stays in memory. Every subscriber receives every message.
package backends
