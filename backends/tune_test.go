package backends_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Config.Tune sees every client configuration a backend builds, after the
// backend's own settings: one per publisher and subscriber.
func TestTune(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
		want      string // the %T of each configuration
	}{
		{"kafka", "kafka://" + strings.Join(testserver.KafkaBrokers(t), ","), fmt.Sprintf("%T", &sarama.Config{})},
		{"redis", "redis://" + testserver.RedisAddr(t) + "/0", fmt.Sprintf("%T", &redis.Options{})},
		{"amqp", testserver.RabbitMQURL(t), fmt.Sprintf("%T", &amqp091.Config{})},
		{"nats", testserver.NATSURL(t), fmt.Sprintf("%T", &nats.Options{})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var seen []string
			cfg := backends.Config{URL: tc.url, Group: "tune-" + backendtest.RunID, Consumer: "tuned", Tune: func(c any) {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, fmt.Sprintf("%T", c))
				// The backend's settings come first.
				switch c := c.(type) {
				case *sarama.Config:
					assert.Equal(t, "tuned", c.ClientID)
				case *redis.Options:
					assert.Equal(t, "tuned", c.ClientName)
				case *nats.Options:
					assert.Equal(t, -1, c.MaxReconnect)
				}
			}}
			backendtest.NewBackend(t, cfg)
			mu.Lock()
			defer mu.Unlock()
			assert.GreaterOrEqual(t, len(seen), 2, "the publisher's and the subscriber's")
			for _, s := range seen {
				assert.Equal(t, tc.want, s)
			}
		})
	}
}
