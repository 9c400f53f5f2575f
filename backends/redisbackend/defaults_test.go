package redisbackend_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Tests of the defaults this backend sets over its library's, one per trap.

// A Redis Streams subscriber must use the configured, stable consumer name,
// not a random one per process.
func TestRedisStreams_StableConsumerName(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	topic := backendtest.UniqueTopic("stable")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { _ = rdb.Del(context.Background(), topic).Err() })

	for range 2 { // a restart
		b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group, Consumer: "pod-7f9c"})
		msgs := backendtest.Subscribe(t, b, topic)
		backendtest.Publish(t, b.Publisher, topic, "x")
		assert.Equal(t, "x", backendtest.Receive(t, msgs))
		require.NoError(t, b.Close())
	}
	consumers, err := rdb.XInfoConsumers(context.Background(), topic, group).Result()
	require.NoError(t, err)
	require.Len(t, consumers, 1)
	assert.Equal(t, "pod-7f9c", consumers[0].Name)
}
