package backends

import "time"

// Config selects a broker and tells New how to use it. A service moves from
// one broker to another by changing URL (BROKER_URL) alone, among the
// brokers whose packages it imports: every other field has a default that
// suits every broker, and the per-broker sections are read only by their
// own broker. The sections are plain values, declared here rather than in
// the broker packages, so that one Config (and FromEnv) serves every broker
// without linking any.
//
// Every zero field means its documented default; only URL is required, and
// Group for every broker but gochannel.
type Config struct {
	// URL names the broker by its scheme and says where it is:
	//
	//	kafka://host:9092[,host2:9092]
	//	redis://[user:pass@]host:6379/0   (rediss:// for TLS; go-redis URL options allowed)
	//	amqp://user:pass@host:5672/vhost  (amqps:// for TLS; amqp091 URI options allowed)
	//	nats://[user:pass@]host:4222[,host2:4222]
	//	gochannel://
	//
	// Empty is an error.
	URL string

	// Group is the consumer group. Subscribers that share a group divide the
	// messages of a topic between them (competing consumers); every group
	// receives every message (fan-out). It names the Kafka consumer group,
	// the Redis Streams consumer group, the AMQP queue (topic_group, see
	// amqpbackend) and the NATS JetStream durable consumer. Empty is an
	// error for every broker but gochannel, whose subscribers each receive
	// every message.
	Group string

	// Consumer names this process within Group: the Redis Streams consumer
	// name, and the client name shown by Kafka, RabbitMQ and NATS. Keep it
	// stable across restarts and unique among the processes of a group.
	// Zero means the host name (the pod name on Kubernetes); set it when
	// several processes of one group share a host, or they share one Redis
	// Streams consumer and its pending messages.
	Consumer string

	// NackResendSleep is how long a nacked message waits before it is
	// delivered again, so that a failing handler, or a message whose key is
	// in progress elsewhere, does not spin. Zero means 1 s; negative is an
	// error. Kafka, Redis Streams, AMQP and gochannel wait in the
	// subscriber, holding back the messages behind the nacked one; NATS
	// asks the server to redeliver later (NakWithDelay) and moves on.
	NackResendSleep time.Duration

	// DialTimeout bounds how long New waits for the broker to answer before
	// it returns ErrUnreachable. Zero means 10 s; negative is an error.
	DialTimeout time.Duration

	// Kafka holds settings read only by the Kafka backend.
	Kafka KafkaConfig
	// Redis holds settings read only by the Redis Streams backend.
	Redis RedisConfig
	// AMQP holds settings read only by the AMQP backend.
	AMQP AMQPConfig
	// NATS holds settings read only by the NATS JetStream backend.
	NATS NATSConfig
}

// KafkaConfig holds the Kafka backend's settings.
type KafkaConfig struct {
	// Partitions is the partition count of the topics the backend creates
	// (it creates a topic before its first publish or subscribe; existing
	// topics are left as they are). Zero means 12; negative is an error.
	//
	// A partition is consumed one message at a time: a message that fails,
	// or waits for its key to be free, holds back the messages behind it in
	// its partition, and only those. With one partition it stalls the whole
	// topic. Partitions also bound a group's parallelism, one consumer per
	// partition. 12 lets a group grow to 12 consumers, splits evenly over 1,
	// 2, 3, 4, 6 or 12 of them (16 would leave 3 or 6 consumers unequal
	// shares), and confines a stuck message to a twelfth of the traffic; 12
	// partitions times the replication factor is little for a cluster.
	// Partitions can be added later but never removed, and adding them
	// moves keys to other partitions, so start with enough.
	Partitions int32

	// ReplicationFactor is the replication factor of the topics the backend
	// creates. Zero means 3, or the number of brokers in the cluster when it
	// has fewer; negative is an error.
	ReplicationFactor int16

	// Version is the lowest Kafka version the cluster runs, which decides
	// the protocol versions the client speaks, e.g. "3.6.0". Zero means
	// "2.1.0", the oldest protocol Kafka 4 still accepts.
	Version string

	// Tune, when set, is called last on each sarama.Config the backend
	// builds (one for the publisher, one for the subscriber and topic
	// administration): the place for SASL, TLS or timeouts. Set it with
	// kafkabackend.TuneFunc, which takes a func(*sarama.Config):
	//
	//	cfg.Kafka.Tune = kafkabackend.TuneFunc(func(c *sarama.Config) { c.Net.SASL.Enable = true })
	//
	// Nil means no changes. It cannot be set from the environment.
	Tune KafkaTuner
}

// KafkaTuner changes the client configuration that the Kafka backend
// builds. It is an interface so that this package need not link sarama;
// kafkabackend.TuneFunc implements it for a func(*sarama.Config).
type KafkaTuner interface {
	// TuneKafka is called with each *sarama.Config the Kafka backend
	// builds, after the backend's own settings.
	TuneKafka(saramaConfig any)
}

// RedisConfig holds the Redis Streams backend's settings.
type RedisConfig struct {
	// MaxIdleTime is how long a message may stay delivered but unacked
	// before another consumer of the group claims it (XCLAIM). Redis Streams
	// has no heartbeat: a consumer whose handler is still running loses the
	// message after MaxIdleTime as surely as a dead one does. Keep it above
	// the idempotency lease (40 s): a message claimed from a live consumer
	// then finds its key IN_PROGRESS and the middleware nacks it until the
	// first handler completes, and one claimed from a dead consumer finds
	// the lease already expired and runs at once. A nacked message is not
	// idle: each nack refreshes it, and so does every third of MaxIdleTime
	// while it waits out NackResendSleep, so a message that keeps failing
	// stays with its consumer. Zero means 60 s; negative is an error.
	MaxIdleTime time.Duration

	// ClaimInterval is how often a subscriber looks for messages idle longer
	// than MaxIdleTime. Zero means 5 s; negative is an error.
	ClaimInterval time.Duration

	// MaxLen caps each stream at about this many entries (XADD MAXLEN ~).
	// Trimming drops the oldest entries whether or not every group has read
	// them. Zero means no cap; negative is an error.
	MaxLen int64
}

// AMQPConfig holds the AMQP backend's settings.
type AMQPConfig struct {
	// Prefetch is how many unacked messages RabbitMQ hands to each
	// subscription at once. Zero means 1; negative is an error.
	Prefetch int

	// PublishGroups lists the consumer groups whose durable queues the
	// publisher declares and binds at every publish to a topic, so that
	// messages published before those groups first subscribe, or after a
	// listed group's queue was deleted, wait in their queues instead of
	// being refused or missed. (RabbitMQ's mandatory flag, which the
	// publisher sets, catches a message that no queue receives, not one
	// that misses one group's queue while another group's receives it.)
	//
	// Zero means none: a group's queue then exists from the first time one
	// of its subscribers subscribes (or calls SubscribeInitialize), and a
	// publish to a topic that no queue is bound to returns ErrUnroutable
	// instead of being dropped. List only groups that consume the topics
	// this process publishes to: a listed group's queue of a topic it never
	// consumes collects messages without bound.
	PublishGroups []string
}

// NATSConfig holds the NATS JetStream backend's settings.
type NATSConfig struct {
	// AckWait is how long the server waits for an ack, or for a progress
	// ack, before it redelivers a message (the durable consumer's AckWait).
	// The subscriber sends a progress ack when a handler receives a message
	// and every AckWait/3 while it runs, so only a message whose consumer
	// died, or that waited in the client longer than AckWait before a
	// handler took it, is redelivered. Keep it above the idempotency lease (40 s), so that a
	// dead consumer's key is free when its message comes back. Zero means
	// 60 s; negative is an error.
	AckWait time.Duration

	// MaxAckPending caps the messages delivered but not yet acked across
	// the whole group, per topic. Messages queued in a client beyond what it
	// can handle within AckWait are redelivered elsewhere, so keep it small.
	// Zero means 100; negative is an error.
	MaxAckPending int
}
