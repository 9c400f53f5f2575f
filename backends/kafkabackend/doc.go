// Package kafkabackend is the Kafka broker of package backends. Imported
// for its side effect, it registers kafka://host:9092[,host2:9092]. It
// links watermill-kafka and sarama (with gokrb5).
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/kafkabackend"
//
// # Parameters
//
//	kafka://k1:9092,k2:9092?partitions=24&replication_factor=3&version=3.6.0
//
// Package backends lists the parameters; version is 0.10.2.0 at least.
// Credentials never go in the URL: set SASL and TLS in backends.Config.Tune,
// which receives each *sarama.Config.
//
// # What it sets
//
// The subscriber joins backends.Config.Group; a new group starts at the
// oldest offset (sarama: the newest). The protocol is version (watermill's
// 1.0.0 is refused by Kafka 4). The producer waits for all in-sync
// replicas; sarama's leader alone loses acked messages on a leader change.
//
// The backend creates each topic before its first publish or subscribe,
// not relying on auto.create.topics.enable (one partition); existing topics
// stay as they are. Messages carry no key: order holds within a partition
// only. A partition is consumed one message at a time, so a failing
// message holds back its partition alone: with 12, a twelfth of the topic.
// 12 splits evenly over 1, 2, 3, 4, 6 or 12 consumers. Partitions can be
// added but never removed.
//
// # Failures
//
// A nacked message is resent after NackResendSleep, holding back its
// partition until it is acked. A dead consumer's messages come again after
// the group rebalances (its session timeout, 10 s), from the last committed
// offset; the middleware acks those it handled as duplicates. A rebalance
// waits up to 5 s per member, under sarama's 30 s read timeout; New refuses
// a Tune that leaves Net.ReadTimeout no longer, or the group never settles.
//
// kfake, the in-process Kafka of the tests, serves in development only:
// docs/OPERATIONS.md ("Kafka on kfake") says how.
package kafkabackend
