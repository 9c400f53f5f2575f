package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// fillRedis writes 16 MiB in one script, which Redis lets run past the
// server's maxmemory (8 MiB) since it started below it, and checks that
// the server now refuses writes.
func fillRedis(t *testing.T, admin *redis.Client) {
	t.Helper()
	ctx := context.Background()
	const fill = "for i = 1, 256 do redis.call('SET', 'fill:' .. i, string.rep('x', 65536)) end return 1"
	require.NoError(t, admin.Eval(ctx, fill, nil).Err())
	err := admin.Set(ctx, "probe", "x", 0).Err()
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "OOM "), "the server is full: %v", err)
}

// TestFullRedisAnswersDuplicates: on a Redis whose memory is full
// (maxmemory, noeviction), which refuses every SET, a duplicate of a
// COMPLETED key is still answered with its record, on every claim path; a
// key held by another owner is still refused as in progress; a fresh claim
// fails with an error that says the Redis is full, and writes nothing.
func TestFullRedisAnswersDuplicates(t *testing.T) {
	srv := testserver.StartRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	admin := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	paths := []struct {
		name string
		opts redisstore.Options
		set  func(*redisstore.Store)
	}{
		{"auto-pipelined", redisstore.Options{}, func(*redisstore.Store) {}},
		{"on its own", redisstore.Options{DisableAutoPipelining: true}, func(*redisstore.Store) {}},
		{"claim.lua", redisstore.Options{}, redisstore.ClaimWithScriptOnly},
		{"replica acknowledgement", redisstore.Options{Replicas: 1, ReplicaTimeout: 20 * time.Millisecond}, func(*redisstore.Store) {}},
	}
	stores := make([]*redisstore.Store, len(paths))
	for i, p := range paths {
		client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
		t.Cleanup(func() { _ = client.Close() })
		s, err := redisstore.New(client, &p.opts)
		require.NoError(t, err)
		p.set(s)
		stores[i] = s
	}
	s := stores[0]
	done := claimReq(time.Minute, []byte("fp"))
	res, err := s.Claim(ctx, "done", done)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, s.Complete(ctx, "done", done.Token, []byte("out"), time.Hour))
	held := claimReq(time.Minute, nil)
	res, err = s.Claim(ctx, "held", held)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	for _, s := range stores { // the scripts are loaded before memory fills
		_, err := s.Get(ctx, "done")
		require.NoError(t, err)
	}
	fillRedis(t, admin)

	for i, p := range paths {
		s := stores[i]
		dup, err := s.Claim(ctx, "done", claimReq(time.Minute, []byte("fp")))
		require.NoError(t, err, "%s: a duplicate of a COMPLETED key on a full Redis", p.name)
		assert.False(t, dup.Acquired, p.name)
		assert.Equal(t, idempotency.StateCompleted, dup.Record.State, p.name)
		assert.Equal(t, []byte("out"), dup.Record.Result, p.name)

		other, err := s.Claim(ctx, "held", claimReq(time.Minute, nil))
		require.NoError(t, err, "%s: a claim of a held key on a full Redis", p.name)
		assert.False(t, other.Acquired, p.name)
		assert.Equal(t, idempotency.StateInProgress, other.Record.State, p.name)

		_, err = s.Claim(ctx, "new-"+p.name, claimReq(time.Minute, nil))
		require.Error(t, err, "%s: a fresh claim on a full Redis", p.name)
		assert.Contains(t, err.Error(), "Redis is full", p.name)
		var rerr redis.Error
		assert.ErrorAs(t, err, &rerr, "%s: the server's reply is kept", p.name)
		n, err := admin.Exists(ctx, "new-"+p.name).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s: nothing written", p.name)
	}

	// Reads, and deletes that free memory, are not refused.
	rec, err := s.Get(ctx, "done")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)

	// The owner's own transitions are refused too, with the same error.
	for op, call := range map[string]func() error{
		"renew":    func() error { return s.Renew(ctx, "held", held.Token, time.Minute) },
		"complete": func() error { return s.Complete(ctx, "held", held.Token, nil, time.Hour) },
		"fail":     func() error { return s.Fail(ctx, "held", held.Token, time.Hour) },
	} {
		err := call()
		require.Error(t, err, op)
		assert.Contains(t, err.Error(), "Redis is full", op)
	}
	require.NoError(t, s.Delete(ctx, "held"))

	// Scripts flushed while full: SCRIPT LOAD is not refused, and the
	// duplicate is still answered.
	require.NoError(t, admin.ScriptFlush(ctx).Err())
	for i, p := range paths {
		dup, err := stores[i].Claim(ctx, "done", claimReq(time.Minute, nil))
		require.NoError(t, err, "%s: a duplicate after SCRIPT FLUSH on a full Redis", p.name)
		assert.Equal(t, idempotency.StateCompleted, dup.Record.State, p.name)
	}

	// Watermill's repository: a key seen within its window is still a
	// duplicate; a new one is an error that says why.
	repo, err := redisstore.NewExpiringKeyRepository(admin, "dedup:", time.Hour)
	require.NoError(t, err)
	require.NoError(t, admin.FlushAll(ctx).Err())
	seen, err := repo.IsDuplicate(ctx, "seen")
	require.NoError(t, err)
	require.False(t, seen)
	fillRedis(t, admin)
	seen, err = repo.IsDuplicate(ctx, "seen")
	require.NoError(t, err, "a seen key on a full Redis")
	assert.True(t, seen)
	_, err = repo.IsDuplicate(ctx, "unseen")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Redis is full")
}
