package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestAutoPipeliningReleaseAfterGivenUpClaim: a claim is stuck on a
// connection that stalls, and its caller gives up (as the owner protocol
// does at its store timeout) and releases the claim at once, as
// Store.Release's doc asks. The release must not overtake the claim it
// undoes: once the stalled connection carries the claim after all, the key
// is left absent, not IN_PROGRESS under a token nobody holds (which would
// stall the key until its lease lapsed and count an attempt that never
// ran).
func TestAutoPipeliningReleaseAfterGivenUpClaim(t *testing.T) {
	direct := testserver.RedisClient(t)
	prefix := keyPrefix(t, direct)
	ds, err := redisstore.New(direct, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), ds, prefix+"warm")) // scripts loaded
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 32, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)

	key, token := prefix+"given-up", storekit.NewToken()
	ctx, cancel := context.WithCancel(context.Background())
	claimed := make(chan error, 1)
	proxy.SetLatency(300 * time.Millisecond)
	go func() {
		_, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
		claimed <- err
	}()
	require.Eventually(t, func() bool { return proxy.Conns() == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, proxy.StallAll())
	proxy.SetLatency(0)
	cancel()
	require.ErrorIs(t, <-claimed, context.Canceled)

	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	var released sync.WaitGroup
	var rerr error
	released.Go(func() { rerr = s.Release(rctx, key, token) })
	time.Sleep(100 * time.Millisecond) // a release on another connection is done by now
	proxy.ResumeAll()
	released.Wait()

	require.NoError(t, rerr)
	// The stalled claim reaches Redis within moments of the resume; the key
	// must stay absent.
	require.Never(t, func() bool {
		rec, err := ds.Get(context.Background(), key)
		require.NoError(t, err)
		if rec.State != idempotency.StateAbsent {
			t.Logf("the given-up claim was applied after its release: %+v", rec)
			return true
		}
		return false
	}, time.Second, 10*time.Millisecond)
}

// TestAutoPipeliningCompleteGivenUpAppliedLater: a Complete stuck on a
// stalled connection is given up, and the owner's retry (same token, same
// result) succeeds on another connection. When the stalled one is carried
// at last, the record stays COMPLETED with that result, attempts 1.
func TestAutoPipeliningCompleteGivenUpAppliedLater(t *testing.T) {
	direct := testserver.RedisClient(t)
	prefix := keyPrefix(t, direct)
	ds, err := redisstore.New(direct, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), ds, prefix+"warm"))
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 32, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	key, token := prefix+"k", storekit.NewToken()
	res, err := ds.Claim(context.Background(), key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
	require.NoError(t, err)
	require.True(t, res.Acquired)

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	proxy.SetLatency(300 * time.Millisecond)
	go func() { first <- s.Complete(ctx, key, token, []byte("out"), time.Minute) }()
	require.Eventually(t, func() bool { return proxy.Conns() == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, proxy.StallAll())
	proxy.SetLatency(0)
	cancel()
	require.ErrorIs(t, <-first, context.Canceled)
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	require.NoError(t, s.Complete(rctx, key, token, []byte("out"), time.Minute), "the owner's retry")
	proxy.ResumeAll()
	require.Never(t, func() bool {
		rec, err := ds.Get(context.Background(), key)
		require.NoError(t, err)
		if rec.State != idempotency.StateCompleted || string(rec.Result) != "out" || rec.Attempts != 1 {
			t.Logf("record after the late Complete: %+v", rec)
			return true
		}
		return false
	}, 500*time.Millisecond, 10*time.Millisecond)
}

// TestAutoPipeliningResetMidBatch: connections are reset in the middle of
// replies while 32 goroutines claim and complete fresh keys with go-redis's
// default MaxRetries, so batches are resent. Every message is reported
// done exactly when its key is COMPLETED, with one attempt.
func TestAutoPipeliningResetMidBatch(t *testing.T) {
	direct := testserver.RedisClient(t)
	prefix := keyPrefix(t, direct)
	ds, err := redisstore.New(direct, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), ds, prefix+"warm"))
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 16})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	proxy.SetLatency(2 * time.Millisecond)
	const workers, each = 32, 10
	var wg sync.WaitGroup
	errs := make([][]error, workers)
	for w := range workers {
		errs[w] = make([]error, each)
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				errs[w][i] = fresh(ctx, s, fmt.Sprintf("%s%d:%d", prefix, w, i))
				cancel()
			}
		})
	}
	for range 6 {
		time.Sleep(15 * time.Millisecond)
		proxy.ResetMidReply()
	}
	wg.Wait()
	t.Logf("%d replies cut", proxy.Resets())
	require.Positive(t, proxy.Resets())
	failed := 0
	for w := range workers {
		for i := range each {
			rec, err := ds.Get(context.Background(), fmt.Sprintf("%s%d:%d", prefix, w, i))
			require.NoError(t, err)
			if errs[w][i] != nil {
				failed++
				t.Logf("%d:%d failed: %v (record %s)", w, i, errs[w][i], rec.State)
				continue
			}
			require.Equal(t, idempotency.StateCompleted, rec.State, "%d:%d reported done", w, i)
			require.Equal(t, 1, rec.Attempts)
		}
	}
	require.Zero(t, failed, "calls failed though go-redis resends after a reset")
}
