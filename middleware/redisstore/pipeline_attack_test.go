package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
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

// TestAutoPipeliningClientClosedMidFlight: the client is closed while 64
// goroutines have calls in go-redis's auto-pipeliner. Every call returns
// (an error or its reply), none hangs, and the calls made after the close
// fail with an error.
func TestAutoPipeliningClientClosedMidFlight(t *testing.T) {
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 16})
	prefix := keyPrefix(t, testserver.RedisClient(t))
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), s, prefix+"warm"))
	proxy.SetLatency(10 * time.Millisecond)
	const workers = 64
	done := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := 0; ; i++ {
				if err := fresh(context.Background(), s, fmt.Sprintf("%s%d:%d", prefix, w, i)); err != nil {
					done <- err
					return
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, client.Close())
	for range workers {
		select {
		case err := <-done:
			require.Error(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("a call in flight when the client was closed never returned")
		}
	}
	_, err = s.Claim(context.Background(), prefix+"after", idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
	require.Error(t, err, "a claim on a closed client")
	require.Error(t, s.Release(context.Background(), prefix+"after", storekit.NewToken()), "a release on a closed client")
}

// TestAutoPipeliningScriptFlushStorm: SCRIPT FLUSH every 20 ms while 64
// goroutines claim and complete fresh keys with 3 s to live. Every call
// succeeds, every key reported completed is COMPLETED, and each script is
// loaded at most once per flush: a call that meets NOSCRIPT after a load
// that ended since it sent its EVALSHA sends it again without loading.
func TestAutoPipeliningScriptFlushStorm(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = admin.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, admin.ConfigResetStat(ctx).Err())

	stop := make(chan struct{})
	flushes := 0
	var flusher sync.WaitGroup
	flusher.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				require.NoError(t, admin.ScriptFlush(ctx).Err())
				flushes++
			}
		}
	})
	const workers, each = 64, 20
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				errs <- fresh(cctx, s, fmt.Sprintf("k%d:%d", w, i))
				cancel()
			}
		})
	}
	wg.Wait()
	close(stop)
	flusher.Wait()
	close(errs)
	failed := 0
	var first error
	for err := range errs {
		if err != nil {
			failed++
			first = cmpErr(first, err)
		}
	}
	require.Zero(t, failed, "%d of %d fresh messages failed under SCRIPT FLUSH; first: %v", failed, workers*each, first)
	// Counted before the reads below, whose Get script is a third one
	// (loaded once more after the last flush).
	stats := commandCalls(t, admin)
	t.Logf("%d flushes; server: %v", flushes, stats)
	for w := range workers {
		for i := range each {
			rec, err := s.Get(ctx, fmt.Sprintf("k%d:%d", w, i))
			require.NoError(t, err)
			require.Equal(t, idempotency.StateCompleted, rec.State)
		}
	}
	// Two scripts (claim, complete), each loaded once at the start and at
	// most once after each flush.
	require.LessOrEqual(t, stats["script|load"], 2*(flushes+1), "more than one load per script and flush")
}

// TestAutoPipeliningRedisRestart: Redis restarts under 32 goroutines of
// fresh messages. Every call returns; after the restart every call
// succeeds again, the scripts loaded once.
func TestAutoPipeliningRedisRestart(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 32})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	const workers = 32
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_ = fresh(cctx, s, fmt.Sprintf("r%d:%d", w, i))
				cancel()
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	srv.Restart()
	time.Sleep(100 * time.Millisecond)
	returned := make(chan struct{})
	go func() { close(stop); wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(15 * time.Second):
		t.Fatal("a call did not return across a restart")
	}
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			errs <- fresh(cctx, s, "after"+strconv.Itoa(w))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestAutoPipeliningOrderedAppPipeliner: an application that made the
// client's deferred auto-pipeliner first, with go-redis's defaults (one
// ordered batch on the wire), keeps it, and the store sends each of its
// calls on its own.
func TestAutoPipeliningOrderedAppPipeliner(t *testing.T) {
	client, hook, proxy := countedClient(t)
	app, err := client.AsyncAutoPipeline()
	require.NoError(t, err)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	require.Equal(t, 1, app.Config().MaxConcurrentBatches)
	require.False(t, app.Config().Unordered)
	prefix := keyPrefix(t, client)
	require.NoError(t, fresh(context.Background(), s, prefix+"warm"))
	proxy.SetLatency(20 * time.Millisecond)
	hook.reset()
	var wg sync.WaitGroup
	errs := make(chan error, poolSize)
	for i := range poolSize {
		wg.Go(func() { errs <- fresh(context.Background(), s, prefix+strconv.Itoa(i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	trips, cmds := hook.counts()
	require.Equal(t, 2*poolSize, cmds)
	require.Equal(t, cmds, trips, "calls were batched through the application's ordered auto-pipeliner")
}

// TestAutoPipeliningNoReadTimeout: with no ReadTimeout on the client
// (ReadTimeout -1), a batch on a connection that stalls would wait for ever.
// Eight calls stuck on stalled connections give up at their deadlines; the
// calls made afterwards still succeed.
func TestAutoPipeliningNoReadTimeout(t *testing.T) {
	direct := testserver.RedisClient(t)
	prefix := keyPrefix(t, direct)
	ds, err := redisstore.New(direct, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), ds, prefix+"warm"))
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, ReadTimeout: -1, PoolSize: 32, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)

	proxy.SetLatency(300 * time.Millisecond)
	var stuck sync.WaitGroup
	for i := range 8 {
		stuck.Go(func() { _ = claimWithin(s, prefix+"stuck"+strconv.Itoa(i), 500*time.Millisecond) })
		require.Eventually(t, func() bool { return proxy.Conns() == i+1 }, 5*time.Second, time.Millisecond)
		require.Equal(t, 1, proxy.StallAll())
	}
	proxy.SetLatency(0)
	stuck.Wait()
	defer proxy.ResumeAll()

	const calls = 20
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { errs <- claimWithin(s, prefix+"k"+strconv.Itoa(i), time.Second) })
	}
	wg.Wait()
	close(errs)
	failed := 0
	var first error
	for err := range errs {
		if err != nil {
			failed++
			first = cmpErr(first, err)
		}
	}
	require.Zero(t, failed, "%d of %d claims failed after 8 stalled connections, with no ReadTimeout; first: %v", failed, calls, first)
}

// TestReplicaStopsMidRun: with Options.Replicas 1, the only replica stops
// while 16 goroutines claim, complete, fail and read keys. Every call
// succeeds (a transition the replica missed is a shortfall, counted), none
// waits past its deadline, and Fail and Get keep working.
func TestReplicaStopsMidRun(t *testing.T) {
	master, replica := startReplicated(t)
	client := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true, PoolSize: 32})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	const workers, each = 16, 12
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				key := fmt.Sprintf("rs%d:%d", w, i)
				err := fresh(ctx, s, key)
				if err == nil && i%3 == 0 {
					tok := storekit.NewToken()
					var res idempotency.ClaimResult
					res, err = s.Claim(ctx, key+":f", idempotency.ClaimRequest{Token: tok, Lease: time.Minute, TTL: time.Minute})
					if err == nil && res.Acquired {
						err = s.Fail(ctx, key+":f", tok, time.Minute)
					}
				}
				if err == nil {
					var rec idempotency.Record
					rec, err = s.Get(ctx, key)
					if err == nil && rec.State != idempotency.StateCompleted {
						err = fmt.Errorf("%s is %s", key, rec.State)
					}
				}
				errs <- err
				cancel()
				if i == 3 && w == 0 {
					replica.Stop()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	stats := s.ReplicaStats()
	t.Logf("%+v", stats)
	require.Positive(t, stats.Shortfalls, "no shortfall counted after the replica stopped")
	require.Positive(t, stats.Acknowledged)
}
