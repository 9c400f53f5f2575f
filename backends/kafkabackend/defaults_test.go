package kafkabackend_test

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Tests of the defaults this backend sets over its library's, one per trap.

// Kafka topics are created by the backend (the in-process cluster has auto
// creation off) with the configured partitions and, by default, a
// replication factor of min(3, brokers).
func TestKafka_CreatesTopics(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t, testserver.KafkaOptions{Brokers: 3, Partitions: 8})
	if len(brokers) < 3 {
		t.Skip("KAFKA_BROKERS names fewer than 3 brokers; this test checks the replication default on 3")
	}
	topic := backendtest.UniqueTopic("created")
	b := backendtest.NewBackend(t, backends.Config{
		URL:   backendtest.WithParams("kafka://"+strings.Join(brokers, ","), "partitions", "5"),
		Group: "billing-" + backendtest.RunID,
	})
	backendtest.Publish(t, b.Publisher, topic, "first")
	msgs := backendtest.Subscribe(t, b, topic)
	assert.Equal(t, "first", backendtest.Receive(t, msgs), "a new group starts at the oldest offset")

	meta := describeTopic(t, brokers, topic)
	assert.Len(t, meta.Partitions, 5)
	for _, p := range meta.Partitions {
		assert.Len(t, p.Replicas, 3)
	}
}

// Topics created without the partitions parameter get 12, not the broker's 1: with
// one partition a single failing message holds back the whole topic, and a
// group cannot have more than one active consumer. The in-process cluster's
// own default is 8, so 12 can only come from the backend.
func TestKafka_DefaultPartitions(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t, testserver.KafkaOptions{Partitions: 8})
	topic := backendtest.UniqueTopic("default-partitions")
	b := backendtest.NewBackend(t, backends.Config{URL: "kafka://" + strings.Join(brokers, ","), Group: "billing-" + backendtest.RunID})
	require.NoError(t, b.Subscriber.(message.SubscribeInitializer).SubscribeInitialize(topic))

	assert.Len(t, describeTopic(t, brokers, topic).Partitions, 12, "the default partition count of a created topic")
}

// describeTopic returns what the Kafka cluster of brokers knows of topic.
func describeTopic(t *testing.T, brokers []string, topic string) *sarama.TopicMetadata {
	t.Helper()
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(brokers, conf)
	require.NoError(t, err)
	defer admin.Close()
	meta, err := admin.DescribeTopics([]string{topic})
	require.NoError(t, err)
	require.Len(t, meta, 1)
	require.Equal(t, sarama.ErrNoError, meta[0].Err, "topic %s", topic)
	return meta[0]
}

// Kafka redelivers a nacked message after NackResendSleep, and the one behind
// it in its partition waits. One partition, so that both are in it.
func TestKafka_NackRedelivers(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t)
	topic := backendtest.UniqueTopic("nack")
	b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams("kafka://"+strings.Join(brokers, ","), "partitions", "1"), Group: "g-" + backendtest.RunID,
		NackResendSleep: 100 * time.Millisecond})
	backendtest.Publish(t, b.Publisher, topic, "a", "b")
	msgs := backendtest.Subscribe(t, b, topic)
	m := <-msgs
	require.Equal(t, "a", string(m.Payload))
	m.Nack()
	assert.Equal(t, "a", backendtest.Receive(t, msgs))
	assert.Equal(t, "b", backendtest.Receive(t, msgs))
}

// A Tune that leaves sarama's read timeout no longer than the group's
// rebalance timeout is refused: a JoinGroup waits up to the rebalance
// timeout, and a member whose read gives up first rejoins for ever.
func TestKafka_RefusesReadTimeoutWithinRebalance(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t)
	for _, tune := range []func(c *sarama.Config){
		func(c *sarama.Config) { c.Consumer.Group.Rebalance.Timeout = 60 * time.Second }, // sarama's default, above the read timeout
		func(c *sarama.Config) { c.Net.ReadTimeout = c.Consumer.Group.Rebalance.Timeout },
	} {
		_, err := backends.New(backends.Config{URL: "kafka://" + strings.Join(brokers, ","), Group: "g-" + backendtest.RunID, Tune: tuneSarama(tune)}, backendtest.Logger())
		require.ErrorIs(t, err, backends.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "Net.ReadTimeout")
	}
}

// tuneSarama is f as a Config.Tune: it changes each *sarama.Config.
func tuneSarama(f func(*sarama.Config)) func(any) {
	return func(client any) {
		if c, ok := client.(*sarama.Config); ok {
			f(c)
		}
	}
}
