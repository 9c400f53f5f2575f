package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The guarantees of auto-pipelining, each against a real Redis through the
// fault proxy: a call's deadline, its replica wait and its progress while
// other connections stall are its own, and NOSCRIPT costs a batch one
// script load, not one round trip per call.

// claimWithin claims a fresh key under a context of its own that ends
// after d.
func claimWithin(s *redisstore.Store, key string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
	if err == nil && !res.Acquired {
		err = errors.New("claim of a fresh key refused")
	}
	return err
}

// TestAutoPipeliningMixedDeadlines: callers with 300 ms deadlines and
// callers with 10 s deadlines share batches while Redis pauses for a
// second (DEBUG SLEEP). The short calls fail; none of the long ones does,
// though their batches carried calls whose deadlines passed.
func TestAutoPipeliningMixedDeadlines(t *testing.T) {
	srv := testserver.StartRedis(t, "--enable-debug-command", "local")
	proxy := testserver.StartFaultProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 64, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = admin.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), s, "warm"))

	var stop atomic.Bool
	var longFailed, shortFailed, longDone atomic.Int32
	var firstLongErr atomic.Value
	var wg sync.WaitGroup
	const workers = 32
	for w := range workers {
		long := w%2 == 0
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				key := "w" + strconv.Itoa(w) + ":" + strconv.Itoa(i)
				if !long {
					if claimWithin(s, key, 300*time.Millisecond) != nil {
						shortFailed.Add(1)
					}
					continue
				}
				if err := claimWithin(s, key, 10*time.Second); err != nil {
					longFailed.Add(1)
					firstLongErr.CompareAndSwap(nil, err)
				}
				longDone.Add(1)
			}
		})
	}
	require.Eventually(t, func() bool { return longDone.Load() > workers }, 10*time.Second, time.Millisecond, "the calls do not flow")
	// The pause: every batch on the wire meanwhile holds short and long calls.
	require.NoError(t, admin.Do(context.Background(), "debug", "sleep", "1").Err())
	before := longDone.Load()
	require.Eventually(t, func() bool { return longDone.Load() > before+workers }, 10*time.Second, time.Millisecond, "the calls do not flow after the pause")
	stop.Store(true)
	wg.Wait()
	t.Logf("failed: %d short calls (300 ms), %d long calls (10 s) of %d", shortFailed.Load(), longFailed.Load(), longDone.Load())
	require.Positive(t, shortFailed.Load(), "no short call failed: the pause was not felt")
	require.Zero(t, longFailed.Load(), "a call with 10 s left failed beside calls with 300 ms: %v", firstLongErr.Load())
}

// startLaggingReplica starts a master and a replica that reaches it through
// a fault proxy delaying each direction by lag, so that a WAIT takes about
// twice lag.
func startLaggingReplica(t *testing.T, lag time.Duration) (master *testserver.RedisServer, replica *testserver.RedisServer) {
	master = testserver.StartRedis(t, "--repl-diskless-sync-delay", "0")
	link := testserver.StartFaultProxy(t, master.Addr)
	host, port, err := net.SplitHostPort(link.Addr)
	require.NoError(t, err)
	replica = testserver.StartRedis(t, "--replicaof", host, port)
	c := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	require.Eventually(t, func() bool {
		n, err := c.Wait(context.Background(), 1, 50*time.Millisecond).Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the replica never connected")
	link.SetLatency(lag)
	return master, replica
}

// TestReplicaWaitIsEachCallsOwn: under replica acknowledgement, with a
// replica 160 ms behind, claims with 250 ms left (whose own WAIT gets at
// most 125 ms) run beside claims and completions with 10 s left. The long calls wait for the replica as long
// as they need (Options.ReplicaTimeout, 2 s): none of them is reported as a
// shortfall, whatever the short calls beside them had left.
func TestReplicaWaitIsEachCallsOwn(t *testing.T) {
	master, _ := startLaggingReplica(t, 80*time.Millisecond)
	proxy := testserver.StartFaultProxy(t, master.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	var mu sync.Mutex
	var longShort []redisstore.ReplicaShortfall
	var shortShort atomic.Int32
	s, err := redisstore.New(client, &redisstore.Options{
		Replicas:       1,
		ReplicaTimeout: 2 * time.Second,
		OnReplicaShortfall: func(op, key string, acked int) {
			sf := redisstore.ReplicaShortfall{Op: op, Key: key, Acked: acked, Wanted: 1}
			if strings.HasPrefix(sf.Key, "short:") {
				shortShort.Add(1)
				return
			}
			mu.Lock()
			longShort = append(longShort, sf)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), s, "long:warm"))

	var wg sync.WaitGroup
	var longFailed atomic.Int32
	const workers, rounds = 16, 4
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				suffix := strconv.Itoa(w) + ":" + strconv.Itoa(i)
				if w%2 == 1 {
					_ = claimWithin(s, "short:"+suffix, 250*time.Millisecond)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := fresh(ctx, s, "long:"+suffix); err != nil {
					longFailed.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	t.Logf("replica stats %+v; short calls' own shortfalls: %d", s.ReplicaStats(), shortShort.Load())
	require.Zero(t, longFailed.Load())
	require.Empty(t, longShort, "calls with 10 s left had their replica wait cut short")
}

// TestFailAndReleaseDoNotWaitForReplicas: with replica acknowledgement and
// a replica that never answers (stopped), claims wait the whole
// ReplicaTimeout (2 s) for it. Fail and Release, sent meanwhile with a
// second to live, never wait for a replica, theirs or the claims': they all
// succeed.
func TestFailAndReleaseDoNotWaitForReplicas(t *testing.T) {
	master, replica := startReplicated(t)
	proxy := testserver.StartFaultProxy(t, master.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 2 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()
	const n = 16
	tokens := make([]string, 2*n)
	for i := range tokens {
		tokens[i] = storekit.NewToken()
		_, err := s.Claim(ctx, "k"+strconv.Itoa(i), idempotency.ClaimRequest{Token: tokens[i], Lease: time.Minute, TTL: time.Minute})
		require.NoError(t, err)
	}
	replica.Stop()

	var wg sync.WaitGroup
	var started atomic.Int32
	for i := range 4 { // claims that wait for the stopped replica
		wg.Go(func() {
			started.Add(1)
			_ = claimWithin(s, "waiting"+strconv.Itoa(i), 10*time.Second)
		})
	}
	require.Eventually(t, func() bool { return started.Load() == 4 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // let them reach their WAIT
	errs := make(chan error, 2*n)
	for i := range 2 * n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			key := "k" + strconv.Itoa(i)
			if i%2 == 0 {
				errs <- s.Fail(ctx, key, tokens[i], time.Minute)
			} else {
				errs <- s.Release(ctx, key, tokens[i])
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestAutoPipeliningNoscriptOneExtraRoundTrip: after SCRIPT FLUSH, 40
// claims, each with a second to live, are made at 40 ms round trip while
// Redis pauses for 300 ms (DEBUG SLEEP) under two reads, so that they go
// out together and meet NOSCRIPT together. None fails: the batch waits for
// one script load and is sent again as a batch, not call by call.
func TestAutoPipeliningNoscriptOneExtraRoundTrip(t *testing.T) {
	srv := testserver.StartRedis(t, "--enable-debug-command", "local")
	proxy := testserver.StartFaultProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { _ = client.Close() })
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = admin.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, fresh(ctx, s, "warm"))
	_, err = s.Get(ctx, "warm")
	require.NoError(t, err)
	proxy.SetLatency(20 * time.Millisecond)
	require.NoError(t, admin.ScriptFlush(ctx).Err())
	require.NoError(t, admin.ConfigResetStat(ctx).Err())

	paused := make(chan error, 1)
	go func() { paused <- admin.Do(ctx, "debug", "sleep", "0.3").Err() }()
	time.Sleep(20 * time.Millisecond) // let the pause begin
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _, _ = s.Get(ctx, "warm") })
	}
	time.Sleep(5 * time.Millisecond) // the reads first
	const calls = 40
	errs := make(chan error, calls)
	for i := range calls {
		wg.Go(func() { errs <- claimWithin(s, "k"+strconv.Itoa(i), time.Second) })
	}
	wg.Wait()
	require.NoError(t, <-paused)
	close(errs)
	failed := 0
	var first error
	for err := range errs {
		if err != nil {
			failed++
			first = cmpErr(first, err)
		}
	}
	stats := commandCalls(t, admin)
	t.Logf("server: %v", stats)
	require.Zero(t, failed, "%d of %d claims failed after NOSCRIPT; first: %v", failed, calls, first)
	require.LessOrEqual(t, stats["script|load"], 2, "more than one load of each script (the read's, the claim's)")
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// TestAutoPipeliningFlowsPastStalledConnections: two calls are stuck on
// connections that stall at the TCP level (they stay open and carry
// nothing). The calls made meanwhile, 20 claims with a second to live,
// all succeed on other connections.
func TestAutoPipeliningFlowsPastStalledConnections(t *testing.T) {
	// Load the scripts on the server, without the proxy: each stuck call
	// below opens a connection of its own through it.
	direct := testserver.RedisClient(t)
	prefix := keyPrefix(t, direct)
	ds, err := redisstore.New(direct, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), ds, prefix+"warm"))
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	// Without maintenance notifications, as doc.go asks: a stall that
	// landed after HELLO would otherwise hold the next connection's
	// handshake (TestAutoPipeliningFlowsPastStalledHandshakes).
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 32, MaxRetries: -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)

	// Two calls on two connections, each stalled while its call is on it.
	proxy.SetLatency(300 * time.Millisecond)
	var stuck sync.WaitGroup
	for i := range 2 {
		stuck.Go(func() { _ = claimWithin(s, prefix+"stuck"+strconv.Itoa(i), 10*time.Second) })
		require.Eventually(t, func() bool { return proxy.Conns() == i+1 }, 5*time.Second, time.Millisecond)
		require.Equal(t, 1, proxy.StallAll())
	}
	proxy.SetLatency(0)

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
	proxy.ResumeAll()
	stuck.Wait()
	require.Zero(t, failed, "%d of %d claims failed beside 2 stalled connections; first: %v", failed, calls, first)
}

// TestClusterPausedPrimaryDelaysNoOtherPrimary: on a cluster of three
// primaries, one pauses for a second (DEBUG SLEEP) under claims of its own
// keys, while claims of the other primaries' keys, each with 300 ms to
// live, go on. None of those fails: a call waits for its own primary only.
func TestClusterPausedPrimaryDelaysNoOtherPrimary(t *testing.T) {
	addrs := testserver.StartRedisCluster(t, "--enable-debug-command", "local")
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs, PoolSize: 64, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	paused, err := client.MasterForKey(ctx, "paused")
	require.NoError(t, err)
	pausedAddr := paused.Options().Addr
	// Keys of the paused primary and keys of the others, by their owner.
	var pausedKeys, otherKeys []string
	for i := 0; len(pausedKeys) < 64 || len(otherKeys) < 256; i++ {
		key := "k" + strconv.Itoa(i)
		node, err := client.MasterForKey(ctx, key)
		require.NoError(t, err)
		if node.Options().Addr == pausedAddr {
			pausedKeys = append(pausedKeys, key)
		} else {
			otherKeys = append(otherKeys, key)
		}
	}
	require.NoError(t, fresh(ctx, s, "warm")) // loads the scripts on every primary

	var stop atomic.Bool
	var otherDone, otherFailed atomic.Int32
	var first atomic.Value
	var wg sync.WaitGroup
	const workers = 32
	for w := range workers {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				if w%4 == 0 { // the paused primary's keys, 10 s to live
					_ = claimWithin(s, pausedKeys[(w+i)%len(pausedKeys)]+":"+strconv.Itoa(w)+":"+strconv.Itoa(i)+"{"+pausedKeys[(w+i)%len(pausedKeys)]+"}", 10*time.Second)
					continue
				}
				key := otherKeys[(w*7+i)%len(otherKeys)]
				if err := claimWithin(s, key+":"+strconv.Itoa(w)+":"+strconv.Itoa(i)+"{"+key+"}", 300*time.Millisecond); err != nil {
					otherFailed.Add(1)
					first.CompareAndSwap(nil, err)
				}
				otherDone.Add(1)
			}
		})
	}
	require.Eventually(t, func() bool { return otherDone.Load() > workers }, 10*time.Second, time.Millisecond)
	require.NoError(t, paused.Do(ctx, "debug", "sleep", "1").Err())
	before := otherDone.Load()
	require.Eventually(t, func() bool { return otherDone.Load() > before+workers }, 10*time.Second, time.Millisecond)
	stop.Store(true)
	wg.Wait()
	require.Zero(t, otherFailed.Load(), "%d of %d claims on the other primaries failed while one primary paused; first: %v", otherFailed.Load(), otherDone.Load(), first.Load())
}
