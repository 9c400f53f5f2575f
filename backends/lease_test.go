package backends_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestCheckLease: an 80 s lease over a 60 s AckWait or MaxIdleTime (the
// defaults included) is refused, naming both; a lease below passes, and
// brokers without a redelivery timer always pass.
func TestCheckLease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   backends.Config
		lease time.Duration
		want  string // a part of the error; "" for none
	}{
		{"nats default lease", backends.Config{URL: "nats://localhost:4222"}, 0, ""},
		{"nats 80s over default ack wait", backends.Config{URL: "nats://localhost:4222"}, 80 * time.Second, "the lease is 1m20s and NATS.AckWait (BROKER_NATS_ACK_WAIT) is 1m0s"},
		{"nats equal", backends.Config{URL: "nats://localhost:4222", NATS: backends.NATSConfig{AckWait: 40 * time.Second}}, 0, "NATS.AckWait"},
		{"nats raised ack wait", backends.Config{URL: "nats://localhost:4222", NATS: backends.NATSConfig{AckWait: 2 * time.Minute}}, 80 * time.Second, ""},
		{"redis default", backends.Config{URL: "redis://localhost:6379/0"}, 0, ""},
		{"redis 80s over default max idle", backends.Config{URL: "redis://localhost:6379/0"}, 80 * time.Second, "Redis.MaxIdleTime (BROKER_REDIS_MAX_IDLE_TIME) is 1m0s"},
		{"redis short max idle", backends.Config{URL: "redis://localhost:6379/0", Redis: backends.RedisConfig{MaxIdleTime: 30 * time.Second}}, 0, "the lease is 40s"},
		{"kafka has no timer", backends.Config{URL: "kafka://localhost:9092"}, time.Hour, ""},
		{"amqp has no timer", backends.Config{URL: "amqp://guest:guest@localhost:5672/"}, time.Hour, ""},
		{"gochannel has no timer", backends.Config{URL: "gochannel://"}, time.Hour, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.CheckLease(onceWithLease(t, tc.lease))
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, backends.ErrLeaseNotBelowRedelivery)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	err := backends.Config{URL: "nats://user:s3cret@localhost:4222"}.CheckLease(onceWithLease(t, time.Hour))
	require.ErrorIs(t, err, backends.ErrLeaseNotBelowRedelivery)
	assert.NotContains(t, err.Error(), "s3cret", "the URL is not in the error")
	assert.ErrorIs(t, backends.Config{URL: "nope://x"}.CheckLease(onceWithLease(t, 0)), backends.ErrUnknownBroker)
}

// onceWithLease is an owner protocol with lease (0: the default).
func onceWithLease(t *testing.T, lease time.Duration) *idempotency.Once {
	t.Helper()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), LeaseTTL: lease})
	require.NoError(t, err)
	return once
}
