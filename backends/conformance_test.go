package backends_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Watermill's own Pub/Sub conformance suite, run against what backends.New
// builds for each broker. The servers are shared, so every run isolates
// itself: topics are unique per test (the suite names them after a UUID), and
// groups are unique per run and per test.

// Subtests the suite skips, and why:
//   - TestReconnect, every broker: it restarts the broker, which on a shared
//     server would break every other test using it. It runs on private
//     servers instead, in reconnect_norace_test.go, beside TestRestart_* in
//     reconnect_test.go (which says why the former builds only without the
//     race detector).
//   - TestNewSubscriberReceivesOldMessages inside TestPubSub, every broker:
//     it needs each new subscriber to receive every message, which with the
//     shared per-test group is a bug, not a feature. Kafka, Redis Streams and
//     NATS run it separately with a fresh group per subscriber
//     (TestNewSubscriberReceivesOldMessages_freshGroups). AMQP cannot pass
//     it: a group's queue exists only from its declaration, and messages
//     published before then were never routed to it.
//   - TestNoAck and TestPublishSubscribeInOrder on Kafka (four partitions
//     here; order holds per partition), Redis Streams (order only with a
//     single subscriber) and gochannel (persistent mode does not order):
//     GuaranteedOrder is false for them, as in their upstream suites.
//   - TestConsumerGroups on gochannel: it has no groups.
//   - TestContinueAfterSubscribeClose and TestConcurrentClose on gochannel:
//     they need messages to outlive an instance (Persistent), which an
//     in-process channel cannot.

// groupFor returns one group per test: every constructor call of one suite
// test shares it, as the processes of one service would, while tests running
// in parallel on other topics do not join it (in Kafka a group spans topics,
// and every member that joins makes the whole group rebalance).
func groupFor(t *testing.T) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(t.Name()))
	return fmt.Sprintf("g-%s-%08x", backendtest.RunID, h.Sum32())
}

// conformance runs tests.TestPubSub on base (with Group filled per test), and
// then, for brokers where a new group starts from the oldest message,
// TestNewSubscriberReceivesOldMessages with a fresh group per constructor
// call: that test needs each subscriber to see every message, which with one
// shared group would be a bug.
//
// Topics are named bk-<backendtest.RunID>-<testID> and every group used is recorded, so
// that cleanup (when not nil) can remove exactly what this run created on a
// shared server, after every subtest has finished.
func conformance(t *testing.T, base backends.Config, features tests.Features, newGroupReadsHistory bool,
	cleanup func(t *testing.T, topicPrefix string, topics, groups []string)) {
	t.Helper()
	var (
		mu             sync.Mutex
		topics, groups []string
	)
	topicPrefix := "bk-" + backendtest.RunID + "-"
	features.GenerateTopicFunc = func(tctx tests.TestContext) string {
		topic := topicPrefix + string(tctx.TestID)
		mu.Lock()
		// TestTopic and TestConcurrentSubscribeMultipleTopics use topic-N.
		topics = append(topics, topic)
		for i := range 20 {
			topics = append(topics, fmt.Sprintf("%s-%d", topic, i))
		}
		mu.Unlock()
		return topic
	}
	if cleanup != nil {
		t.Cleanup(func() {
			mu.Lock()
			defer mu.Unlock()
			cleanup(t, topicPrefix, topics, groups)
		})
	}
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		cfg := base
		if base.Group != "" || group != "" {
			cfg.Group = group
		}
		mu.Lock()
		groups = append(groups, group)
		mu.Unlock()
		b, err := backends.New(cfg, backendtest.Logger())
		require.NoError(t, err)
		return b.Publisher, b.Subscriber
	}
	perTest := func(t *testing.T) (message.Publisher, message.Subscriber) {
		if features.ConsumerGroups {
			return withGroup(t, groupFor(t))
		}
		return withGroup(t, "")
	}
	var cgCtor tests.ConsumerGroupPubSubConstructor
	if features.ConsumerGroups {
		cgCtor = withGroup
	}
	tests.TestPubSub(t, features, perTest, cgCtor)

	if newGroupReadsHistory {
		t.Run("TestNewSubscriberReceivesOldMessages_freshGroups", func(t *testing.T) {
			t.Parallel()
			f := features
			f.NewSubscriberReceivesOldMessages = true
			fresh := func(t *testing.T) (message.Publisher, message.Subscriber) {
				return withGroup(t, "fresh-"+watermill.NewShortUUID())
			}
			tests.TestNewSubscriberReceivesOldMessages(t, tests.TestContext{TestID: tests.NewTestID(), Features: f}, fresh)
		})
	}
}

func TestConformance_GoChannel(t *testing.T) {
	t.Parallel()
	conformance(t, backends.Config{URL: "gochannel://", NackResendSleep: backendtest.FastNack}, tests.Features{
		ConsumerGroups:        false,
		ExactlyOnceDelivery:   true,
		GuaranteedOrder:       false,
		Persistent:            false, // messages live in one instance only
		RequireSingleInstance: true,
		ForceShort:            true,
	}, false, nil)
}

func TestConformance_Kafka(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t)
	conformance(t, backends.Config{
		URL:             backendtest.WithParams("kafka://"+strings.Join(brokers, ","), "partitions", "4"),
		Group:           "set-per-test",
		NackResendSleep: backendtest.FastNack,
		Tune:            fastRebalance,
	}, tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false,
		// Order holds per partition only, and the topics have four.
		GuaranteedOrder: false,
		Persistent:      true,
		ForceShort:      true,
	}, true, nil) // kfake goes away at cleanup; a shared KAFKA_BROKERS cluster keeps the bk-<backendtest.RunID>-* topics
}

func TestConformance_RedisStreams(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	conformance(t, backends.Config{
		URL:             backendtest.WithParams("redis://"+addr+"/0", "max_idle_time", "3s", "claim_interval", "1s"),
		Group:           "set-per-test",
		NackResendSleep: backendtest.FastNack,
	}, tests.Features{
		ConsumerGroups:                      true,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     false,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		ForceShort:                          true,
	}, true, func(t *testing.T, prefix string, _, _ []string) {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = rdb.Del(ctx, iter.Val()).Err()
		}
	})
}

func TestConformance_AMQP(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	conformance(t, backends.Config{
		URL:             url,
		Group:           "set-per-test",
		NackResendSleep: backendtest.FastNack,
	}, tests.Features{
		ConsumerGroups:                      true,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		ForceShort:                          true,
	}, false, func(t *testing.T, _ string, topics, groups []string) {
		testserver.DeleteAMQP(t, url, topics, groups)
	})
}

func TestConformance_NATS(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	conformance(t, backends.Config{
		// The suite closes subscribers holding unacked messages and expects
		// another to get them within seconds.
		URL:             backendtest.WithParams(url, "ack_wait", "3s"),
		Group:           "set-per-test",
		NackResendSleep: backendtest.FastNack,
	}, tests.Features{
		ConsumerGroups:                      true,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		ForceShort:                          true,
	}, true, func(t *testing.T, prefix string, _, _ []string) {
		deleteNATSStreams(t, url, prefix)
	})
}

// deleteNATSStreams deletes the streams whose names start with prefix.
func deleteNATSStreams(t *testing.T, url, prefix string) {
	testserver.WithJetStream(t, url, func(js nats.JetStreamContext) {
		var doomed []string
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, prefix) {
				doomed = append(doomed, name)
			}
		}
		for _, name := range doomed {
			_ = js.DeleteStream(name)
		}
	})
}

// fastRebalance makes a Kafka consumer group rebalance in well under a
// second: the members of the suites' groups come and go by the dozen.
func fastRebalance(client any) {
	if c, ok := client.(*sarama.Config); ok {
		c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
		c.Consumer.Group.Session.Timeout = 6 * time.Second
		c.Consumer.Group.Rebalance.Timeout = 3 * time.Second
	}
}
