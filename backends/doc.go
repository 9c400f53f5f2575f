// Package backends builds a Watermill Publisher and Subscriber for the broker
// named in configuration, so that a service moves from one broker to another
// by changing one environment variable:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/all" // or only the brokers used
//
//	cfg, err := backends.FromEnv() // BROKER_URL, BROKER_GROUP, ...
//	if err != nil { ... }
//	b, err := backends.New(cfg, logger)
//	if err != nil { ... } // ErrUnknownBroker, ErrBrokerNotLinked, ErrMissingGroup, ErrUnreachable, ...
//	router.AddHandler("bill", "orders", b.Subscriber, "invoices", b.Publisher, bill)
//	audit, err := b.SubscriberForGroup(cfg.Group + ".audit") // a second handler of "orders"
//	if err != nil { ... }
//	router.AddConsumerHandler("audit", "orders", audit, record)
//
// with BROKER_URL one of
//
//	kafka://localhost:9092[,host2:9092]
//	redis://[user:pass@]localhost:6379/0    rediss:// for TLS
//	amqp://guest:guest@localhost:5672/vhost amqps:// for TLS
//	nats://localhost:4222[,host2:4222]
//	gochannel://
//
// New picks the broker by the URL's scheme, among the brokers the program
// links (see Linking brokers). Every broker library has defaults that lose
// or duplicate messages in production; each backend replaces them, and its
// package's documentation says with what and why (kafkabackend,
// redisbackend, amqpbackend, natsbackend; gochannel below), as do the
// comments beside the code.
//
// # Linking brokers
//
// Each broker but gochannel lives in a package of its own, which registers
// it with this package when imported, as database/sql drivers do; a program
// imports the packages of the brokers it may use, for their side effect,
// and links only their client libraries:
//
//	import (
//		"github.com/idempotency/watermill-idempotency/backends"
//		_ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
//		_ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
//	)
//
//	Kafka          backends/kafkabackend   watermill-kafka, sarama, gokrb5
//	Redis Streams  backends/redisbackend   watermill-redisstream, go-redis
//	AMQP           backends/amqpbackend    watermill-amqp, amqp091-go
//	NATS           backends/natsbackend    watermill-nats, nats.go
//	every broker   backends/all
//	gochannel      built in (part of Watermill, which this package needs anyway)
//
// Switching brokers still changes BROKER_URL alone, among the brokers the
// program links. A URL naming a broker that is not linked is refused by
// ParseURL, Validate and New with ErrBrokerNotLinked, whose message names
// the import to add; Linked lists what the program links. This package
// imports no broker client library, and Config keeps every broker's
// settings as plain values (Kafka.Tune is an interface that
// kafkabackend.TuneFunc implements), so that one Config serves every broker
// without linking any. ErrUnroutable, ErrDuplicatePublish and
// MetadataUndecodable are declared here too, so that code that checks them
// links no broker either.
//
// What each broker's backend sets over its library's defaults, and why, is
// in its package's documentation.
//
// # Guarantees
//
// Every backend delivers at least once: a message is acked to the broker only
// after the handler acked it (returned nil through the router), and a message
// that was delivered but neither acked nor nacked comes back, to this or
// another member of the group, after a broker-specific time (see each
// broker's package). Nothing here is exactly-once: pair the backend with
// this module's idempotency middleware, which makes a redelivered message's
// effect happen once.
//
// Subscribers that share Config.Group divide a topic's messages between them;
// each group gets every message. Two handlers that subscribe to one topic
// through the one Backend.Subscriber are therefore one group, and each gets
// part of the messages: give every handler of a topic beyond the first a
// Subscriber of its own group, from Backend.SubscriberForGroup. (The
// idempotency middleware scopes keys by handler name so that two handlers
// each process a message once; they must each receive it first.) A new
// group starts at the oldest message the broker still holds (Kafka, Redis
// Streams, NATS), or at the moment its queue was declared (AMQP; see
// amqpbackend), never at "now": a service's first start must not skip what
// was published before it.
//
// A nacked message is redelivered after Config.NackResendSleep (1 s by
// default), not at once. The idempotency middleware nacks a message whose key
// is in progress elsewhere; an immediate redelivery would spin on it.
//
// New connects before it returns. A broker that does not accept a connection
// within Config.DialTimeout (10 s) is an ErrUnreachable naming the address;
// one that refuses it (a wrong password, a missing Redis database or
// RabbitMQ virtual host) is an ErrInvalidConfig, which a retry does not
// mend; a malformed URL, an unknown scheme or a missing group is an error before
// any network traffic. Errors name a broker URL by its scheme and host
// alone: never the URL, its user information (user name, password, token),
// its path or query, or a client library's parse error, which may quote
// them.
//
// # Five cases where brokers differ
//
// What each backend does in the five cases where brokers differ most:
//
//   - A requeued message (published again with its UUID unchanged, as
//     Watermill's requeuer does after PoisonQueue): delivered again on every
//     broker. NATS sends no Nats-Msg-Id, so JetStream deduplicates nothing;
//     a message whose metadata sets Nats-Msg-Id asks for JetStream's
//     deduplication, and a copy it drops is an ErrDuplicatePublish.
//   - An unroutable publish (a topic nobody can receive yet): Kafka and
//     NATS create the topic or stream before the first publish, and Redis
//     Streams keeps the entry in the stream, so a group that starts later
//     reads it. RabbitMQ keeps messages only in queues: a publish that no
//     queue is bound to is an ErrUnroutable (never a silent drop); list the
//     groups in AMQP.PublishGroups to have their queues declared, and
//     declared again if deleted. gochannel keeps every message for later
//     subscribers.
//   - An undecodable message: handed to the handler, never dropped or
//     looped on unseen. NATS joins the values of a repeated header with
//     ", "; AMQP formats a header that is not a string with %v; a Redis
//     Streams entry without a UUID comes with an empty UUID, one with
//     unreadable metadata with MetadataUndecodable instead; Kafka's and
//     gochannel's messages always decode (a repeated Kafka header keeps its
//     last value).
//   - A slow handler: Kafka keeps its message while the consumer stays in
//     the group (a rebalance waits for it up to the rebalance timeout, 5 s;
//     after that the copy another member gets meets the handler's lease);
//     Redis Streams lets another consumer claim it after
//     Redis.MaxIdleTime, live consumer or not; RabbitMQ keeps it until its
//     own consumer_timeout (30 minutes by default) closes the channel;
//     NATS keeps it with progress acks from the moment the handler receives
//     it; gochannel waits.
//   - A failing message (the handler keeps returning an error): redelivered
//     after NackResendSleep, for ever, on every broker. Kafka holds back its
//     partition meanwhile, and the other partitions go on. Redis Streams
//     keeps it with the consumer that holds it, which handles nothing else,
//     while the others go on; RabbitMQ requeues it at the head of the queue,
//     where the consumer that nacked it takes it again: with a single
//     consumer in the group, both wait for it. NATS and gochannel go on with
//     the messages behind it. Set the idempotency middleware's MaxAttempts
//     and put Watermill's PoisonQueue outside it: the message then leaves
//     the topic after MaxAttempts attempts.
//
// The Publisher and the Subscriber each own their connection and close it in
// Close, which a Watermill router calls on both when it stops; Backend.Close
// does the same for code without a router. Close is idempotent.
//
// # gochannel
//
// One in-process, persistent GoChannel serves as both Publisher and
// Subscriber: GoChannel has no state outside its instance, so separate
// instances would never deliver. Persistent means a late subscriber still
// receives everything published before it, as it would from a broker; it
// also means every message stays in memory for the instance's life. There
// are no groups: every subscriber receives every message, and Group is not
// required, and SubscriberForGroup returns one more subscriber of the same
// instance. GoChannel resends a nacked message at once; the subscriber holds
// the nack for NackResendSleep first. Nothing survives the process: use it
// for tests, examples and demos.
package backends
