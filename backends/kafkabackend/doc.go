// Package kafkabackend is the Kafka broker of package backends. Imported
// for its side effect, it registers the broker, and backends.New then
// builds a Publisher and Subscriber for kafka://host:9092[,host2:9092]:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/kafkabackend"
//
// It links watermill-kafka and sarama (with gokrb5, for Kerberos), which a
// program that does not import it does without; New refuses a kafka:// URL
// there with backends.ErrBrokerNotLinked. Beside the broker, the package
// exports TuneFunc, for backends.Config.Kafka.Tune.
//
// The settings named below (Group, Consumer, NackResendSleep and the Kafka
// section) are fields of backends.Config, which holds every broker's
// settings so that one Config, and backends.FromEnv, serves them all.
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
// rebalances, from the last committed offset: the group notices the dead
// member after the session timeout (10 s), and the rebalance waits up to
// the rebalance timeout (5 s, where sarama's is 60 s) for the other members
// to rejoin: a member whose handler runs longer drops out of the group until
// it rejoins, and its message is delivered again elsewhere. Messages after the dead consumer's that were
// already handled come again too, and the idempotency middleware acks them
// as duplicates.
//
// SASL, TLS and timeouts go through Kafka.Tune, which receives the
// sarama.Config of both sides: set it with TuneFunc. A JoinGroup request
// waits up to the rebalance timeout, so New refuses a Net.ReadTimeout (30 s)
// that is not longer than Consumer.Group.Rebalance.Timeout: a member whose
// read gives up first rejoins, on kfake each rejoin starts the wait again,
// and the group stops consuming for good (sarama's defaults, 60 s and 30 s,
// did that after repeated kills).
//
// kfake (github.com/twmb/franz-go/pkg/kfake), the in-process Kafka of the
// tests, can serve a service in development. Several consumer processes
// share one only when it runs in a process of its own, on fixed ports
// (kfake.Ports): each process that calls kfake.NewCluster has a cluster of
// its own, and one started inside a consumer stops with it. It keeps nothing
// across a restart unless given kfake.DataDir: topics, messages and the
// groups' offsets are gone, and since the backend creates each topic once
// per process, publishes fail and subscribers receive nothing until the
// services restart too. Its group coordinator is not Kafka's: it drops a
// member that has waited in a rebalance longer than its session timeout, so
// keep the rebalance timeout below the session timeout there (the defaults
// do); and a consumer killed while it joins its group can stay a member,
// holding its partitions, until the group next rebalances (a consumer starts
// or stops).
package kafkabackend
