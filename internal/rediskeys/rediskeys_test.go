package rediskeys_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// TestDelete deletes more keys than one batch under a pattern, and none
// beside it.
func TestDelete(t *testing.T) {
	c := testserver.RedisClient(t)
	ctx := context.Background()
	prefix := testserver.UniqueName("deletekeys")
	pipe := c.Pipeline()
	for i := range 2500 {
		pipe.Set(ctx, prefix+":gone:"+strconv.Itoa(i), "v", 0)
	}
	pipe.Set(ctx, prefix+":kept", "v", 0)
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { // by KEYS, not by what is under test
		if left, err := c.Keys(context.Background(), prefix+":*").Result(); err == nil && len(left) > 0 {
			_ = c.Del(context.Background(), left...).Err()
		}
	})

	require.NoError(t, rediskeys.Delete(ctx, c, prefix+":gone:*"))
	left, err := c.Keys(ctx, prefix+":*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{prefix + ":kept"}, left)

	require.NoError(t, rediskeys.Delete(ctx, c, prefix+":gone:*"), "nothing left to delete is no error")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, rediskeys.Delete(cancelled, c, prefix+":*"), context.Canceled)
}
