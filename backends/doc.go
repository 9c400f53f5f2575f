// Package backends builds a Watermill Publisher and Subscriber for the broker
// named in configuration, so that a service moves from one broker to another
// by changing one environment variable:
//
//	cfg, err := backends.FromEnv() // BROKER_URL, BROKER_GROUP, ...
//	if err != nil { ... }
//	b, err := backends.New(cfg, logger)
//	if err != nil { ... } // ErrUnknownBroker, ErrMissingGroup, ErrUnreachable, ...
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
// New switches on the URL's scheme, in one place; there is no registration
// and no init. Every broker library has defaults that lose or duplicate
// messages in production; New replaces them, and this page says with what and
// why. The per-broker files (kafka.go, redisstream.go, amqp.go, nats.go,
// gochannel.go) repeat the reasons beside the code.
//
// # Guarantees
//
// Every backend delivers at least once: a message is acked to the broker only
// after the handler acked it (returned nil through the router), and a message
// that was delivered but neither acked nor nacked comes back, to this or
// another member of the group, after a broker-specific time (below). Nothing
// here is exactly-once: pair the backend with this module's idempotency
// middleware, which makes a redelivered message's effect happen once.
//
// Subscribers that share Config.Group divide a topic's messages between them;
// each group gets every message. Two handlers that subscribe to one topic
// through the one Backend.Subscriber are therefore one group, and each gets
// part of the messages: give every handler of a topic beyond the first a
// Subscriber of its own group, from Backend.SubscriberForGroup. (The
// idempotency middleware scopes keys by handler name so that two handlers
// each process a message once; they must each receive it first.) A new group starts at the oldest message the
// broker still holds (Kafka, Redis Streams, NATS), or at the moment its queue
// was declared (AMQP; see below), never at "now": a service's first start
// must not skip what was published before it.
//
// A nacked message is redelivered after Config.NackResendSleep (1 s by
// default), not at once. The idempotency middleware nacks a message whose key
// is in progress elsewhere; an immediate redelivery would spin on it.
//
// New connects before it returns. A broker that does not accept a connection
// within Config.DialTimeout (10 s) is an ErrUnreachable naming the address;
// a malformed URL, an unknown scheme or a missing group is an error before
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
//     the group (a rebalance waits for it up to sarama's rebalance timeout);
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
// # Kafka
//
// watermill-kafka (sarama). The subscriber joins the consumer group Group;
// a new group starts at the oldest offset (sarama's default is the newest).
// The protocol version is Kafka.Version, 2.1.0 by default: watermill pins
// 1.0.0, which Kafka 4 rejects. The producer waits for all in-sync replicas
// (sarama waits for the leader alone, which loses acknowledged messages on a
// leader change).
//
// Topics are created by the backend before its first publish or subscribe to
// them, with Kafka.Partitions partitions (12 by default) and a replication
// factor of Kafka.ReplicationFactor, or min(3, brokers in the cluster).
// Nothing depends on auto.create.topics.enable, which production clusters
// usually disable and which creates topics with the broker's defaults (one
// partition). Existing topics are left unchanged. Messages are published
// without a key, so sarama's partitioner spreads them over the partitions at
// random, and order holds only within one.
//
// Why 12 partitions: a partition is consumed one message at a time, so a
// message that keeps failing, or that waits while its key is in progress
// elsewhere, holds back every message behind it in its partition. With one
// partition that is the whole topic; with 12 it is a twelfth, and the other
// eleven flow on. Partitions also bound a group's parallelism (one consumer
// per partition): 12 lets a group grow to 12 consumers and splits evenly
// over 1, 2, 3, 4, 6 or 12 of them, where 16 would give 3 or 6 consumers
// unequal shares. Partitions cost the brokers memory and file handles per
// replica, but 12 per topic is small; and since partitions can be added but
// never removed, and adding them moves keys to other partitions, it is
// better to start with enough. Set Kafka.Partitions
// (BROKER_KAFKA_PARTITIONS) for a topic that needs more.
//
// A nacked message is resent by the subscriber itself after NackResendSleep
// and holds back the rest of its partition until it is acked. A message
// delivered to a consumer that dies is redelivered after the group
// rebalances (sarama's session timeout, 10 s), from the last committed
// offset: messages after it that were already handled come again too, and the
// idempotency middleware acks them as duplicates.
//
// SASL, TLS and timeouts go through Kafka.Tune, which receives the
// sarama.Config of both sides.
//
// # Redis Streams
//
// watermill-redisstream (go-redis). Each topic is a stream; Group is a
// consumer group on it, created at the start of the stream ("0"). The
// publisher and the subscriber each get their own client from the URL: the
// library closes the client it was given when the publisher or subscriber
// closes, and a router closes both.
//
// The consumer name is Config.Consumer, the host name (the pod name) by
// default, where the library picks a random name per process: a restarted
// process then comes back as the same consumer instead of leaving a dead one
// behind.
//
// A nacked message is resent by the subscriber itself after NackResendSleep
// (the library resends at once, in a loop) and holds back the stream for
// this consumer until it is acked. Each nack also refreshes the entry's idle
// time in Redis (XCLAIM to the same consumer, JUSTID), every third of
// MaxIdleTime while it waits out NackResendSleep and again before the
// resend, so a message that keeps failing stays with its consumer, however
// long NackResendSleep is: without that, its idle time grew
// with every attempt, another consumer claimed it after MaxIdleTime and
// looped on it too, and one failing message stalled the whole group. The
// message the failing consumer has read ahead is claimed by another after
// MaxIdleTime (Config.CheckLease checks the lease against it, and against
// NATS.AckWait). A message delivered but not acked for
// Redis.MaxIdleTime (60 s) is claimed (XCLAIM) by another consumer of the
// group, checked every Redis.ClaimInterval (5 s). Redis Streams has no
// heartbeat, so this happens to a live consumer whose handler is slow as
// surely as to a dead one. MaxIdleTime is therefore kept above the
// idempotency lease (40 s): a message claimed from a live consumer finds its
// key IN_PROGRESS, and the middleware's in-progress nack sends it round again
// until the first handler completes, after which it is acked as a duplicate;
// one claimed from a dead consumer finds the lease expired and runs.
//
// Streams grow without bound unless Redis.MaxLen caps them (approximately;
// trimming drops the oldest entries whether or not every group read them).
//
// # AMQP (RabbitMQ)
//
// watermill-amqp on its durable pub/sub topology: a durable fanout exchange
// per topic and a durable queue per topic and group, named topic_group,
// bound to it. The consumers of a group compete for their queue; each group's
// queue gets every message. Messages are published persistent and with
// publisher confirms: Publish returns only once RabbitMQ has taken the
// message. Each subscription has Prefetch (1) unacked messages at most.
//
// Publishes are mandatory: a fanout exchange discards what no queue is bound
// to, and RabbitMQ still confirms it, so without mandatory a message
// published before any group subscribed, or after a group's queue was
// deleted, was lost while Publish returned nil. RabbitMQ returns such a
// message instead, and Publish returns ErrUnroutable. A group's queue exists
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
// A running consumer whose queue is deleted subscribes again at once,
// declaring the queue anew (watermill-amqp handed the handler an empty
// message first; the backend stops that). A group that is not listed in
// PublishGroups and whose queue is deleted while none of its consumers runs
// misses what is published meanwhile if another group's queue receives it.
//
// RabbitMQ requeues a nacked message to the head of the queue at once; the
// subscriber holds the nack for NackResendSleep first. A message held by a
// consumer whose connection drops is requeued by RabbitMQ at once. A dropped
// connection is redialled with exponential backoff.
//
// # NATS JetStream
//
// Publishing goes through watermill-nats; subscribing through this package's
// own JetStream subscriber, because watermill-nats's closes its output
// channel while a message callback may still send on it.
//
// Each topic is a subject captured by a stream: one the operator created, or
// else one the backend creates on first use (and again on a publish after
// it was deleted), named after the topic, with
// JetStream's defaults (file storage, limits retention, no size or age
// limit, 2-minute duplicate window). Publishes carry no Nats-Msg-Id, so
// JetStream drops nothing as a duplicate: a message republished with its
// UUID (Watermill's requeuer) is delivered again, and the idempotency
// middleware, not the broker, deduplicates. The publisher reads every
// PubAck: a message whose metadata sets Nats-Msg-Id and that JetStream
// drops as a duplicate is an ErrDuplicatePublish, not a success.
//
// Each group reads a topic through a durable push consumer named
// group_topic, with a deliver group of the same name, which the backend
// creates before subscribing: explicit acks, AckWait of NATS.AckWait (60 s,
// above the idempotency lease: a dead consumer's key is then free by the time
// its message comes back),
// MaxAckPending of NATS.MaxAckPending (100; messages buffered in a client
// beyond what it handles within AckWait are redelivered elsewhere), delivery
// from the start of the stream. Messages are acked manually once the handler
// acks: without nats.ManualAck, nats.go acks each message as soon as the
// callback returns, before the handler has run, and a crash loses it.
// Headers become metadata as watermill-nats reads them, except that a
// header with several values (JetStream allows it; watermill-nats rejects
// the message, which was then terminated unseen) becomes one value, the
// values joined with ", " in order.
//
// Shutdown keeps the durable. nats.go deletes a consumer on Unsubscribe or
// Drain when the subscription created it, so a durable created by the first
// member of a group would vanish when that member stops, cutting off the
// others, and the next start would replay the whole stream. Because the
// backend creates the durable itself, subscriptions only bind to it, and it
// survives every shutdown with the group's position: a restarted group
// resumes after its last ack. Delete the durable (nats consumer rm) when a
// group is retired. On Close a message held but not yet acked is nacked at
// once, so another member takes it without waiting for AckWait.
//
// A nacked message is redelivered by the server after NackResendSleep
// (NakWithDelay), without holding back the messages behind it. When a
// handler receives a message, and every third of AckWait while it works on
// it, the subscriber sends a progress ack (InProgress), so a slow handler is
// neither redelivered nor interrupted, however long it runs, and neither is
// a message that waited in the client behind a slow predecessor (its
// AckWait restarts when its handler receives it; before, the first progress
// ack came AckWait/3 later, and a message that had waited more than two
// thirds of AckWait was redelivered while its handler ran). A message held
// by a consumer that died, or that waited in the client for longer than
// AckWait before any handler took it, is redelivered by the server after
// AckWait. Reconnects never give up (nats.go's default
// stops after 60 attempts).
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
