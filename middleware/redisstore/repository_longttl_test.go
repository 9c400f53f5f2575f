package redisstore_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestExpiringKeyRepositoryLongWindows: a window at, around and far beyond
// idempotency.MaxTTL marks its key for MaxTTL: the mark is kept (a second
// sight is a duplicate) and never fails as a bad PX, which Watermill's
// Deduplicator would turn into a nack of every message.
func TestExpiringKeyRepositoryLongWindows(t *testing.T) {
	client := testserver.RedisClient(t)
	ctx := context.Background()
	for _, w := range []time.Duration{idempotency.MaxTTL, idempotency.MaxTTL + 1, math.MaxInt64 - time.Millisecond, math.MaxInt64} {
		prefix := "repo-longttl:" + watermill.NewShortUUID() + ":"
		repo, err := redisstore.NewExpiringKeyRepository(client, prefix, w)
		require.NoError(t, err)
		dup, err := repo.IsDuplicate(ctx, "a")
		require.NoError(t, err, "window %v", w)
		assert.False(t, dup, "window %v: first sight", w)
		dup, err = repo.IsDuplicate(ctx, "a")
		require.NoError(t, err, "window %v", w)
		assert.True(t, dup, "window %v: second sight", w)
		pttl, err := client.PTTL(ctx, prefix+"a").Result()
		require.NoError(t, err)
		assert.Greater(t, pttl, idempotency.MaxTTL-time.Minute, "window %v: the mark is kept for MaxTTL", w)
		require.NoError(t, client.Del(ctx, prefix+"a").Err())
	}
}
