package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestNewFromURL: a store built from a URL honours deadlines (the client
// has ContextTimeoutEnabled) and works against a real Redis; a bad URL is
// ErrInvalidURL, never a panic, and never shows its password.
func TestNewFromURL(t *testing.T) {
	store, client, err := redisstore.NewFromURL("redis://"+testserver.RedisAddr(t)+"/0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	assert.True(t, client.Options().ContextTimeoutEnabled)
	_, err = redisstore.New(client, nil)
	require.NoError(t, err, "New accepts the client: it honours deadlines")

	key := testserver.UniqueName("redisstore-url-")
	t.Cleanup(func() { _ = store.Delete(context.Background(), key) })
	res, err := store.Claim(context.Background(), key, idempotency.ClaimRequest{Token: "t1", Lease: time.Second, TTL: time.Minute})
	require.NoError(t, err)
	assert.True(t, res.Acquired)
	require.NoError(t, store.Complete(context.Background(), key, "t1", []byte("ok"), time.Minute))
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)

	for _, bad := range []string{
		"redis://user:s3cret@localhost:notaport/0",
		"redis://user:s3cret@localhost:6379/notadb",
		"http://user:s3cret@localhost:6379/0",
		"redis://user:s3cret@local\x7fhost:6379/0",
		// Values that redis.ParseURL takes and redis.NewClient panics on.
		"redis://user:s3cret@localhost:6379/0?pool_size=-1",
		"redis://user:s3cret@localhost:6379/0?max_idle_conns=9999999999999",
	} {
		_, client, err := redisstore.NewFromURL(bad, nil)
		require.ErrorIs(t, err, redisstore.ErrInvalidURL, bad)
		assert.Nil(t, client)
		assert.NotContains(t, err.Error(), "s3cret", bad)
	}
}
