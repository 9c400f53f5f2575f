// Package backends builds a Watermill Publisher and Subscriber for the
// broker that one URL names. A service moves to another broker by changing
// BROKER_URL alone:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/all" // or only the brokers used
//
//	cfg, err := backends.FromEnv() // BROKER_URL, BROKER_GROUP, ...
//	if err != nil { ... }
//	b, err := backends.New(cfg, logger)
//	if err != nil { ... } // ErrInvalidConfig: fix it; ErrUnreachable: retry
//	router.AddHandler("bill", "orders", b.Subscriber, "invoices", b.Publisher, bill)
//
// # Broker URLs
//
// The scheme picks the broker:
//
//	kafka://host:9092[,host2:9092]
//	redis://[user:pass@]host:6379/0      rediss:// for TLS
//	amqp://user:pass@host:5672/vhost     amqps:// for TLS
//	nats://[user:pass@]host:4222[,host2:4222]
//	gochannel://
//
// The query holds the broker's own parameters, as pgxpool reads
// pool_max_conns from a connection string. The backend takes them out; the
// client library's URL options (go-redis, amqp091) pass through. A zero
// value means the default.
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
// Keep max_idle_time and ack_wait above the idempotency lease (40 s).
// [Config.CheckLease] checks it. Each broker package explains its
// parameters: kafkabackend, redisbackend, amqpbackend, natsbackend.
//
// # Linking brokers
//
// Each broker but gochannel lives in a package of its own. Imported for its
// side effect, it registers the broker, as database/sql drivers do. A
// program links only the client libraries of the brokers it imports:
//
//	Kafka          backends/kafkabackend   watermill-kafka, sarama, gokrb5
//	Redis Streams  backends/redisbackend   watermill-redisstream, go-redis
//	AMQP           backends/amqpbackend    watermill-amqp, amqp091-go
//	NATS           backends/natsbackend    watermill-nats, nats.go
//	every broker   backends/all
//	gochannel      built in
//
// A URL of a broker that is not linked is an [ErrInvalidConfig]. Its
// message names the import to add. This package imports no broker client:
// [Config.Tune] takes any client configuration for that reason.
//
// # Guarantees
//
// Every backend delivers at least once. A message is acked only after the
// handler acked it. A message delivered but never settled comes back, to
// this or another member of the group. Nothing here is exactly-once: the
// idempotency middleware makes a redelivered message's effect happen once.
//
// Subscribers that share [Config.Group] divide a topic's messages. Each
// group gets every message. Two handlers of one topic on one
// [Backend.Subscriber] are one group: each sees part of the messages. Give
// every further handler a group of its own with [Backend.SubscriberForGroup].
//
// A new group starts at the oldest message the broker holds, never at
// "now". On AMQP it starts when its queue is declared (see amqpbackend).
//
// A nacked message comes back after [Config.NackResendSleep] (1 s), not at
// once. The middleware nacks a key in progress elsewhere; an instant
// redelivery would spin on it.
//
// [New] connects before it returns. A broker that does not answer within
// [Config.DialTimeout] is an [ErrUnreachable]. One that refuses the
// connection (a wrong password, a missing database or virtual host) is an
// [ErrInvalidConfig]: a retry does not mend it. A malformed URL or a missing
// group fails before any network traffic.
//
// Errors name a broker URL by its scheme and host alone. They never show
// its user information, path or query, nor a library's parse error.
//
// Every backend replaces the library defaults that lose or duplicate
// messages. docs/GUARANTEES.md ("Brokers") has what each sets, and how the
// brokers differ on a requeued, unroutable, undecodable, slow or failing
// message. A failing message is retried for ever unless the middleware's
// MaxAttempts and Watermill's PoisonQueue stop it.
//
// An AMQP publish that no queue receives is an [ErrUnroutable], never a
// silent drop. A NATS publish that JetStream drops as a duplicate is an
// [ErrDuplicatePublish]. A Redis Streams entry whose metadata does not
// decode reaches the handler with [MetadataUndecodable] set.
//
// The Publisher and each Subscriber own their connection. A Watermill
// router closes them when it stops; [Backend.Close] does it without one.
// Close is idempotent.
//
// # gochannel
//
// One in-process, persistent GoChannel is both Publisher and Subscriber.
// A late subscriber still receives what was published before it. Every
// message stays in memory for the life of the process. There are no
// groups: every subscriber receives every message, and Group is optional.
// Use it for tests, examples and demos.
package backends
