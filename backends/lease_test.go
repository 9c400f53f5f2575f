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

// TestCheckLease: an 80 s lease over a 60 s ack_wait or max_idle_time (the
// defaults included) is refused, naming both; a lease below passes, and
// brokers without a redelivery timer always pass.
func TestCheckLease(t *testing.T) {
	for _, tc := range []struct {
		name  string
		url   string
		lease time.Duration
		want  string // a part of the error; "" for none
	}{
		{"nats default lease", "nats://localhost:4222", 0, ""},
		{"nats 80s over default ack wait", "nats://localhost:4222", 80 * time.Second, "the lease is 1m20s and nats redelivers after 1m0s (ack_wait)"},
		{"nats equal", "nats://localhost:4222?ack_wait=40s", 0, "ack_wait"},
		{"nats raised ack wait", "nats://localhost:4222?ack_wait=2m", 80 * time.Second, ""},
		{"redis default", "redis://localhost:6379/0", 0, ""},
		{"redis 80s over default max idle", "redis://localhost:6379/0", 80 * time.Second, "redis redelivers after 1m0s (max_idle_time)"},
		{"redis short max idle", "redis://localhost:6379/0?max_idle_time=30s", 0, "the lease is 40s"},
		{"kafka has no timer", "kafka://localhost:9092", time.Hour, ""},
		{"amqp has no timer", "amqp://guest:guest@localhost:5672/", time.Hour, ""},
		{"gochannel has no timer", "gochannel://", time.Hour, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := backends.Config{URL: tc.url}.CheckLease(onceWithLease(t, tc.lease))
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	err := backends.Config{URL: "nats://user:s3cret@localhost:4222"}.CheckLease(onceWithLease(t, time.Hour))
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.NotContains(t, err.Error(), "s3cret", "the URL is not in the error")
	err = backends.Config{URL: "nope://x"}.CheckLease(onceWithLease(t, 0))
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "unknown broker scheme")
}

// onceWithLease is an owner protocol with lease (0: the default).
func onceWithLease(t *testing.T, lease time.Duration) *idempotency.Once {
	t.Helper()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), LeaseTTL: lease})
	require.NoError(t, err)
	return once
}
