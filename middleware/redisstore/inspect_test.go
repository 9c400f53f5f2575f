package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// Records walks exactly the keys under its prefix (glob characters in it are
// literal), with each record, TTL and memory, a corrupt value as its Err;
// on a Cluster it walks every master.
func TestRecordsUnderPrefix(t *testing.T) {
	t.Parallel()
	s, client, prefix := newStore(t)
	ctx := context.Background()
	p := prefix + "a*[b]?:"
	for _, k := range []string{"done", "busy"} {
		res, err := s.Claim(ctx, p+k, claimReq(time.Minute, nil))
		require.NoError(t, err)
		if k == "done" {
			require.NoError(t, s.Complete(ctx, p+k, res.Record.Token, make([]byte, 1000), time.Hour))
		}
	}
	require.NoError(t, client.Set(ctx, p+"junk", "not a record", time.Minute).Err())
	// Keys the unescaped glob would match.
	require.NoError(t, client.Set(ctx, prefix+"aX[b]Y:other", "x", time.Minute).Err())
	require.NoError(t, client.Set(ctx, prefix+"ab?:other", "x", time.Minute).Err())

	got := map[string]idempotency.Entry{}
	for e, err := range s.Records(ctx, p) {
		require.NoError(t, err)
		got[e.Key] = e
	}
	require.Len(t, got, 3, "%v", got)
	assert.Equal(t, idempotency.StateCompleted, got[p+"done"].Record.State)
	assert.Greater(t, got[p+"done"].TTL, 59*time.Minute)
	assert.Greater(t, got[p+"done"].Bytes, int64(1000), "the result and the record's overhead")
	assert.Greater(t, got[p+"busy"].Bytes, int64(0))
	assert.Equal(t, idempotency.StateInProgress, got[p+"busy"].Record.State)
	assert.ErrorIs(t, got[p+"junk"].Err, idempotency.ErrCorruptRecord)

	n := 0
	for range s.Records(ctx, p) {
		n++
		break
	}
	assert.Equal(t, 1, n, "the walk stops when the caller does")
}

func TestRecordsOnCluster(t *testing.T) {
	t.Parallel()
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	prefix := testserver.UniqueName("inspect-cluster:")
	want := map[string]bool{}
	for i := range 30 { // spread over the three masters' slots
		key := prefix + string(rune('a'+i%26)) + string(rune('0'+i/26))
		_, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
		require.NoError(t, err)
		want[key] = true
	}
	got := map[string]bool{}
	for e, err := range s.Records(ctx, prefix) {
		require.NoError(t, err)
		require.NoError(t, e.Err)
		got[e.Key] = true
	}
	assert.Equal(t, want, got)
}

// DeleteIf deletes only in the states named, atomically, and reports what
// it found; a lapsed lease is FAILED; a corrupt value is kept.
func TestDeleteIf(t *testing.T) {
	t.Parallel()
	s, client, prefix := newStore(t)
	ctx := context.Background()
	both := []idempotency.State{idempotency.StateInProgress, idempotency.StateFailed}

	_, err := s.Claim(ctx, prefix+"busy", claimReq(time.Minute, nil))
	require.NoError(t, err)
	found, deleted, err := s.DeleteIf(ctx, prefix+"busy", idempotency.StateFailed)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, found)
	assert.False(t, deleted, "a live lease is not FAILED")
	found, deleted, err = s.DeleteIf(ctx, prefix+"busy", both...)
	require.NoError(t, err)
	assert.True(t, deleted)
	assert.Equal(t, idempotency.StateInProgress, found)
	rec, err := s.Get(ctx, prefix+"busy")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateAbsent, rec.State)

	_, err = s.Claim(ctx, prefix+"lapsed", claimReq(5*time.Millisecond, nil))
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	found, deleted, err = s.DeleteIf(ctx, prefix+"lapsed", idempotency.StateFailed)
	require.NoError(t, err)
	assert.True(t, deleted)
	assert.Equal(t, idempotency.StateFailed, found)

	res, err := s.Claim(ctx, prefix+"done", claimReq(time.Minute, nil))
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, prefix+"done", res.Record.Token, nil, time.Minute))
	found, deleted, err = s.DeleteIf(ctx, prefix+"done", both...)
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Equal(t, idempotency.StateCompleted, found)

	found, deleted, err = s.DeleteIf(ctx, prefix+"absent", both...)
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Equal(t, idempotency.StateAbsent, found)

	require.NoError(t, client.Set(ctx, prefix+"junk", "x", time.Minute).Err())
	_, _, err = s.DeleteIf(ctx, prefix+"junk", idempotency.StateCompleted, idempotency.StateFailed)
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	assert.EqualValues(t, 1, client.Exists(ctx, prefix+"junk").Val(), "a corrupt value is not deleted")

	_, _, err = s.DeleteIf(ctx, prefix+"x", idempotency.StateAbsent)
	assert.Error(t, err, "absent is not a state to delete")
}
