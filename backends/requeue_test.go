package backends_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/requeuer"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
)

// A message that fails into Watermill's PoisonQueue and is put back on its
// topic by Watermill's requeuer, with its UUID unchanged, is delivered
// again, on every broker. On NATS it was not: JetStream took the UUID for a
// Nats-Msg-Id and dropped the copy, and Publish returned nil.
func TestRequeuedMessageIsDeliveredAgain(t *testing.T) {
	t.Parallel()
	for _, gb := range append(groupedBrokers, groupedBroker{
		name:    "gochannel",
		config:  func(*testing.T, string) backends.Config { return backends.Config{URL: "gochannel://"} },
		cleanup: func(*testing.T, string, ...string) {},
	}) {
		t.Run(gb.name, func(t *testing.T) {
			t.Parallel()
			topic, poisonTopic := backendtest.UniqueTopic("orders"), backendtest.UniqueTopic("orders-poison")
			group := "shop-" + backendtest.RunID
			t.Cleanup(func() {
				gb.cleanup(t, topic, group)
				gb.cleanup(t, poisonTopic, group+".requeue")
			})
			b := backendtest.NewBackend(t, gb.config(t, group))
			requeueSub, err := b.SubscriberForGroup(group + ".requeue")
			require.NoError(t, err)

			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, backendtest.Logger())
			require.NoError(t, err)
			poison, err := middleware.PoisonQueue(b.Publisher, poisonTopic)
			require.NoError(t, err)
			var mu sync.Mutex
			deliveries := map[string]int{}
			router.AddConsumerHandler("charge", topic, b.Subscriber, func(msg *message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				deliveries[msg.UUID]++
				if deliveries[msg.UUID] == 1 {
					return errors.New("first attempt fails into the poison queue")
				}
				return nil
			}).AddMiddleware(poison)
			_, err = requeuer.NewRequeuer(requeuer.Config{
				Subscriber:     requeueSub,
				SubscribeTopic: poisonTopic,
				Publisher:      b.Publisher,
				GeneratePublishTopic: func(requeuer.GeneratePublishTopicParams) (string, error) {
					return topic, nil
				},
				Router: router,
			}, backendtest.Logger())
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- router.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-done
			})
			<-router.Running()

			uuid := watermill.NewUUID()
			require.NoError(t, b.Publisher.Publish(topic, message.NewMessage(uuid, []byte("order"))))
			deadline := time.Now().Add(30 * time.Second)
			for {
				mu.Lock()
				n := deliveries[uuid]
				mu.Unlock()
				if n >= 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the requeued message was delivered %d times, want 2 (the first attempt, then the requeued copy)", n)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
