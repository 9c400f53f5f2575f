// Package kafkabackend is the Kafka broker of package backends. Imported
// for its side effect, it registers kafka://host:9092[,host2:9092]:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/kafkabackend"
//
// It links watermill-kafka and sarama (with gokrb5). A program that does
// not import it links neither.
//
// # Parameters
//
//	kafka://k1:9092,k2:9092?partitions=24&replication_factor=3&version=3.6.0
//
// partitions (12) and replication_factor (min(3, brokers)) shape the
// topics the backend creates. version (2.1.0) is the lowest Kafka version
// the cluster runs, 0.10.2.0 at least. Credentials never go in the URL: set SASL and TLS in
// backends.Config.Tune, which receives each *sarama.Config.
//
// # What it sets
//
// The subscriber joins backends.Config.Group. A new group starts at the
// oldest offset; sarama starts at the newest. The protocol is version:
// watermill pins 1.0.0, which Kafka 4 rejects. The producer waits for all
// in-sync replicas; sarama waits for the leader alone, which loses
// acknowledged messages on a leader change.
//
// The backend creates each topic before its first publish or subscribe.
// Nothing depends on auto.create.topics.enable, which makes one partition.
// Existing topics stay as they are. Messages carry no key: they spread over
// the partitions at random, and order holds within one partition only.
//
// A partition is consumed one message at a time. A failing message holds
// back its partition, and only that one: with 12, a twelfth of the topic.
// 12 also splits evenly over 1, 2, 3, 4, 6 or 12 consumers. Partitions can
// be added but never removed, so start with enough.
//
// # Failures
//
// A nacked message is resent by the subscriber after NackResendSleep. It
// holds back its partition until it is acked.
//
// A dead consumer's messages come again after the group rebalances, from
// the last committed offset. The group notices the death after the session
// timeout (10 s). A rebalance waits up to 5 s for each member; sarama's
// 60 s outlasts its own read timeout. New refuses a Tune that leaves
// Net.ReadTimeout no longer than the rebalance timeout: the group could
// never settle. Messages the dead consumer had handled come again too; the
// idempotency middleware acks them as duplicates.
//
// kfake, the in-process Kafka of the tests, serves in development only:
// docs/OPERATIONS.md ("Kafka on kfake") says how.
package kafkabackend
