package backends_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// groupedBroker is a broker with consumer groups, on the shared servers (or
// kfake), with what a test needs to clean up after itself.
type groupedBroker struct {
	name    string
	config  func(t *testing.T, group string) backends.Config
	cleanup func(t *testing.T, topic string, groups ...string)
}

var groupedBrokers = []groupedBroker{
	{
		name: "kafka",
		config: func(t *testing.T, group string) backends.Config {
			return backends.Config{URL: backendtest.WithParams("kafka://"+strings.Join(testserver.KafkaBrokers(t), ","), "partitions", "2"), Group: group,
				NackResendSleep: backendtest.FastNack,
				Tune:            fastRebalance}
		},
		cleanup: func(*testing.T, string, ...string) {}, // kfake goes away with the test binary
	},
	{
		name: "redis",
		config: func(t *testing.T, group string) backends.Config {
			return backends.Config{URL: "redis://" + testserver.RedisAddr(t) + "/0", Group: group, NackResendSleep: backendtest.FastNack}
		},
		cleanup: func(t *testing.T, topic string, _ ...string) {
			_ = testserver.RedisClient(t).Del(context.Background(), topic).Err()
		},
	},
	{
		name: "amqp",
		config: func(t *testing.T, group string) backends.Config {
			return backends.Config{URL: testserver.RabbitMQURL(t), Group: group, NackResendSleep: backendtest.FastNack}
		},
		cleanup: func(t *testing.T, topic string, groups ...string) {
			testserver.DeleteAMQP(t, testserver.RabbitMQURL(t), []string{topic}, groups)
		},
	},
	{
		name: "nats",
		config: func(t *testing.T, group string) backends.Config {
			return backends.Config{URL: testserver.NATSURL(t), Group: group, NackResendSleep: backendtest.FastNack}
		},
		cleanup: func(t *testing.T, topic string, _ ...string) {
			testserver.DeleteNATSStreams(t, testserver.NATSURL(t), topic)
		},
	},
}

// Two handlers on one topic, the second on a Subscriber of its own group
// (SubscriberForGroup), each receive every message, on every broker with
// groups. With one Subscriber for both, they were one group and divided the
// messages (Redis Streams 10/10 of 20, NATS 8/12).
func TestSubscriberForGroup_TwoHandlersOneTopic(t *testing.T) {
	t.Parallel()
	for _, gb := range append(groupedBrokers, groupedBroker{
		name:    "gochannel",
		config:  func(*testing.T, string) backends.Config { return backends.Config{URL: "gochannel://"} },
		cleanup: func(*testing.T, string, ...string) {},
	}) {
		t.Run(gb.name, func(t *testing.T) {
			t.Parallel()
			topic := backendtest.UniqueTopic("orders")
			group := "shop-" + backendtest.RunID
			notifyGroup := group + ".notify"
			t.Cleanup(func() { gb.cleanup(t, topic, group, notifyGroup) })
			b := backendtest.NewBackend(t, gb.config(t, group))
			notifySub, err := b.SubscriberForGroup(notifyGroup)
			require.NoError(t, err)

			const n = 20
			var mu sync.Mutex
			seen := map[string]map[string]bool{"charge": {}, "notify": {}}
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, backendtest.Logger())
			require.NoError(t, err)
			for name, sub := range map[string]message.Subscriber{"charge": b.Subscriber, "notify": notifySub} {
				router.AddConsumerHandler(name, topic, sub, func(msg *message.Message) error {
					mu.Lock()
					defer mu.Unlock()
					seen[name][msg.UUID] = true
					return nil
				})
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- router.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-done
			})
			<-router.Running()

			for i := range n {
				require.NoError(t, b.Publisher.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte{byte(i)})))
			}
			counts := func() (int, int) {
				mu.Lock()
				defer mu.Unlock()
				return len(seen["charge"]), len(seen["notify"])
			}
			deadline := time.Now().Add(45 * time.Second)
			for {
				c, nt := counts()
				if c == n && nt == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("of %d messages, charge got %d and notify %d: each handler must get every one", n, c, nt)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// SubscriberForGroup needs a group (but for gochannel, which has none), and
// Backend.Close closes what it built.
func TestSubscriberForGroup_Validation(t *testing.T) {
	t.Parallel()
	b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + testserver.RedisAddr(t) + "/0", Group: "g-" + backendtest.RunID})
	_, err := b.SubscriberForGroup(" ")
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	require.ErrorContains(t, err, "missing consumer group")
	// Config.Group itself would be one group with b.Subscriber, dividing
	// the messages, where the doc promises a group of its own.
	_, err = b.SubscriberForGroup(" g-" + backendtest.RunID)
	require.Error(t, err, "SubscriberForGroup of Config.Group")

	gc := backendtest.NewBackend(t, backends.Config{URL: "gochannel://"})
	sub, err := gc.SubscriberForGroup("")
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), "orders")
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	_, open := <-msgs
	assert.False(t, open, "Close ends the group subscriber's subscriptions")
	// The shared instance stays open for the Backend's own Subscriber.
	backendtest.Publish(t, gc.Publisher, "orders", "still open")
	assert.Equal(t, "still open", backendtest.Receive(t, backendtest.Subscribe(t, gc, "orders")))
}

// Backend.Close closes the Subscribers of SubscriberForGroup (their
// subscriptions end), and a SubscriberForGroup after Close is an error: it
// used to connect a new Subscriber that nothing would ever close.
func TestSubscriberForGroup_Close(t *testing.T) {
	t.Parallel()
	for _, br := range groupedBrokers {
		if br.name == "kafka" {
			continue // the same code path; kfake's group joins are slow
		}
		t.Run(br.name, func(t *testing.T) {
			t.Parallel()
			topic := backendtest.UniqueTopic("group-close")
			group := "close-" + backendtest.RunID
			t.Cleanup(func() { br.cleanup(t, topic, group, group+".other") })
			b, err := backends.New(br.config(t, group), backendtest.Logger())
			require.NoError(t, err)
			other, err := b.SubscriberForGroup(group + ".other")
			require.NoError(t, err)
			msgs, err := other.Subscribe(context.Background(), topic)
			require.NoError(t, err)

			require.NoError(t, b.Close())
			select {
			case m, open := <-msgs:
				assert.False(t, open, "a message %v after Close", m)
			case <-time.After(15 * time.Second):
				t.Fatal("Backend.Close left the group subscriber's subscription open")
			}
			late, err := b.SubscriberForGroup(group + ".late")
			if late != nil {
				_ = late.Close()
			}
			require.Error(t, err, "SubscriberForGroup after Close")
			require.NoError(t, b.Close(), "Close again")
		})
	}
}
