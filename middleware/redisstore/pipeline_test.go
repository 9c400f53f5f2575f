package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// poolSize is the connection pool of countedClient; it opens them all at
// once, so that a stall of the proxy's open connections stalls every call.
const poolSize = 8

// countedClient is a client of the shared Redis, through a fault proxy,
// whose script round trips and commands are counted.
func countedClient(t *testing.T) (*redis.Client, *roundTrips, *testserver.FaultProxy) {
	proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: poolSize, PipelinePoolSize: -1, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	conns := make([]*redis.Conn, poolSize)
	for i := range conns {
		conns[i] = client.Conn()
		require.NoError(t, conns[i].Ping(ctx).Err())
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	hook := scriptTrips()
	client.AddHook(hook)
	return client, hook, proxy
}

// scriptTrips counts the round trips that carry the store's transitions
// (EVALSHA, EVAL, the plain claim's SET) or WAIT, and those commands.
func scriptTrips() *roundTrips {
	return &roundTrips{only: map[string]bool{"evalsha": true, "eval": true, "set": true, "wait": true}}
}

// keyPrefix returns a prefix of the test's own; its keys are deleted when
// the test ends.
func keyPrefix(t *testing.T, client *redis.Client) string {
	prefix := testserver.UniqueName("test:ap:") + ":"
	t.Cleanup(func() { require.NoError(t, rediskeys.Delete(context.Background(), client, prefix+"*")) })
	return prefix
}

// fresh claims and completes one key, as a fresh message does.
func fresh(ctx context.Context, s idempotency.Store, key string) error {
	tok := storekit.NewToken()
	res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: tok, Lease: time.Minute, TTL: time.Minute})
	if err != nil {
		return err
	}
	if !res.Acquired {
		return fmt.Errorf("claim of fresh key %q refused: %+v", key, res.Record)
	}
	return s.Complete(ctx, key, tok, []byte("out"), time.Minute)
}

// TestAutoPipeliningBatchesConcurrentCalls: 64 goroutines whose calls meet
// a busy store (30 ms of latency each way) share round trips, and each
// call is still its own command: 2 per fresh message, 1 per duplicate.
func TestAutoPipeliningBatchesConcurrentCalls(t *testing.T) {
	client, hook, proxy := countedClient(t)
	proxy.SetLatency(30 * time.Millisecond)
	batchesConcurrentCalls(t, client, hook, keyPrefix(t, client))
}

func batchesConcurrentCalls(t *testing.T, client redis.UniversalClient, hook *roundTrips, prefix string) {
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	// Load the scripts first: a NOSCRIPT resend would add commands.
	require.NoError(t, fresh(ctx, s, prefix+"warm"))

	const goroutines, perGoroutine = 64, 4
	run := func(f func(key string) error) {
		var wg sync.WaitGroup
		errs := make(chan error, goroutines*perGoroutine)
		for g := range goroutines {
			wg.Go(func() {
				for i := range perGoroutine {
					errs <- f(prefix + strconv.Itoa(g) + ":" + strconv.Itoa(i))
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	hook.reset()
	run(func(key string) error { return fresh(ctx, s, key) })
	trips, cmds := hook.counts()
	t.Logf("fresh: %d messages, %d commands, %d round trips", goroutines*perGoroutine, cmds, trips)
	require.Equal(t, 2*goroutines*perGoroutine, cmds, "commands for fresh messages")
	require.Less(t, trips, cmds/4, "round trips: the calls were not batched")

	hook.reset()
	run(func(key string) error {
		res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
		if err == nil && (res.Acquired || res.Record.State != idempotency.StateCompleted) {
			err = fmt.Errorf("duplicate %q: %+v", key, res)
		}
		return err
	})
	trips, cmds = hook.counts()
	t.Logf("duplicates: %d messages, %d commands, %d round trips", goroutines*perGoroutine, cmds, trips)
	require.Equal(t, goroutines*perGoroutine, cmds, "commands for duplicates")
	require.Less(t, trips, cmds/4, "round trips: the calls were not batched")
}

// TestAutoPipeliningLoneCallGoesOutAtOnce: a caller that finds the store
// idle sends its command on its own, as a store without auto-pipelining
// does: no pipeline, one round trip per command.
func TestAutoPipeliningLoneCallGoesOutAtOnce(t *testing.T) {
	client, hook, _ := countedClient(t)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	prefix := keyPrefix(t, client)
	ctx := context.Background()
	require.NoError(t, fresh(ctx, s, prefix+"warm"))
	hook.reset()
	for i := range 20 {
		require.NoError(t, fresh(ctx, s, prefix+strconv.Itoa(i)))
	}
	trips, cmds := hook.counts()
	require.Equal(t, 40, cmds)
	require.Equal(t, 40, trips, "a lone caller's commands were held for a batch")
}

// TestAutoPipeliningCallGivenUpReturns: a call stuck behind stalled
// connections returns when its context ends, and the calls stuck there get
// their replies when the connections resume. go-redis does not withdraw a
// command it was handed, so the given-up claim may still run then, as a
// command written to a plain client's connection may: Release with its
// token undoes it, and the key is left absent.
func TestAutoPipeliningCallGivenUpReturns(t *testing.T) {
	client, _, proxy := countedClient(t)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	prefix := keyPrefix(t, client)
	ctx := context.Background()
	require.NoError(t, fresh(ctx, s, prefix+"warm"))
	claim := func(ctx context.Context, key, token string) error {
		_, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
		return err
	}

	proxy.StallAll() // every connection of the pool

	const stuck = poolSize
	stuckErrs := make(chan error, stuck)
	var sent atomic.Int32
	for i := range stuck {
		go func() {
			sent.Add(1)
			stuckErrs <- claim(context.Background(), prefix+"stuck"+strconv.Itoa(i), storekit.NewToken())
		}()
	}
	require.Eventually(t, func() bool { return sent.Load() == stuck }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // let them reach the stalled sockets

	given, token := prefix+"given-up", storekit.NewToken()
	gctx, cancel := context.WithCancel(context.Background())
	gave := make(chan error, 1)
	go func() { gave <- claim(gctx, given, token) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-gave:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("a call whose context ended did not return while the connections stalled")
	}

	proxy.ResumeAll()
	for range stuck {
		require.NoError(t, <-stuckErrs)
	}
	require.NoError(t, s.Release(ctx, given, token))
	rec, err := s.Get(ctx, given)
	require.NoError(t, err)
	require.Equal(t, idempotency.StateAbsent, rec.State, "Release did not undo the given-up claim")
}

// TestAutoPipeliningDeadlines: calls stuck on stalled connections each
// return at their own deadline, with its error, and nothing hangs.
func TestAutoPipeliningDeadlines(t *testing.T) {
	client, _, proxy := countedClient(t)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	prefix := keyPrefix(t, client)
	require.NoError(t, fresh(context.Background(), s, prefix+"warm"))
	proxy.StallAll()
	const calls = 32
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := s.Claim(ctx, prefix+strconv.Itoa(i), idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
			if err == nil {
				err = errors.New("a claim succeeded through a stalled connection")
			} else if !errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("want the deadline's error, got %w", err)
			} else {
				err = nil
			}
			errs <- err
		}()
	}
	for range calls {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("a call outlived its deadline by seconds")
		}
	}
	proxy.ResumeAll()
}

// TestConformanceWithoutAutoPipelining runs the store contract with every
// call on its own (the default auto-pipelines; TestConformanceStandalone).
func TestConformanceWithoutAutoPipelining(t *testing.T) {
	client := testserver.RedisClient(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s, err := redisstore.New(client, &redisstore.Options{DisableAutoPipelining: true})
		require.NoError(t, err)
		return storetest.Subject{Store: s, PutForeign: putForeign(client), FreshClaimTimes: freshClaimTimes}
	})
}

// TestAutoPipeliningReplicaAck: with replica acknowledgement, concurrent
// claims and completions are not auto-pipelined: each is one pipeline of
// its script and a WAIT of its own, on one connection (WAIT counts only the
// writes of its connection), and every one of them is acknowledged.
func TestAutoPipeliningReplicaAck(t *testing.T) {
	master, _ := startReplicated(t)
	proxy := testserver.StartFaultProxy(t, master.Addr)
	proxy.SetLatency(20 * time.Millisecond)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: 128})
	t.Cleanup(func() { _ = client.Close() })
	hook := scriptTrips()
	client.AddHook(hook)
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 2 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, fresh(ctx, s, "warm"))
	hook.reset()
	before := s.ReplicaStats()

	const calls = 64
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Go(func() { errs <- fresh(ctx, s, "k"+strconv.Itoa(i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	after := s.ReplicaStats()
	trips, cmds := hook.counts()
	t.Logf("%d fresh messages: %d commands, %d round trips, %+v", calls, cmds, trips, after)
	require.Equal(t, uint64(2*calls), after.Acknowledged-before.Acknowledged, "claims and completions acknowledged")
	require.Zero(t, after.Shortfalls-before.Shortfalls)
	require.Equal(t, 4*calls, cmds, "each claim and completion: its script and its own WAIT")
	require.Equal(t, 2*calls, trips, "each claim and completion: one round trip")
}

// BenchmarkAutoPipelining: a fresh message (claim and complete) on the
// store alone, with auto-pipelining and without, by one goroutine and by
// 64; it reports round trips per message.
//
//	go test -run '^$' -bench AutoPipelining ./middleware/redisstore/
func BenchmarkAutoPipelining(b *testing.B) {
	for _, off := range []bool{false, true} {
		for _, par := range []int{1, 64} {
			name := fmt.Sprintf("pipelining=%v/c%d", !off, par)
			b.Run(name, func(b *testing.B) {
				client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: testserver.RedisAddr(b), PoolSize: 128})
				b.Cleanup(func() { _ = client.Close() })
				hook := scriptTrips()
				client.AddHook(hook)
				s, err := redisstore.New(client, &redisstore.Options{DisableAutoPipelining: off})
				if err != nil {
					b.Fatal(err)
				}
				prefix := "bench:ap:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
				b.Cleanup(func() { unlinkPrefix(client, prefix) })
				var n atomic.Int64
				ctx := context.Background()
				hook.reset()
				b.ResetTimer()
				if par == 1 {
					for b.Loop() {
						if err := fresh(ctx, s, prefix+strconv.FormatInt(n.Add(1), 36)); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism(par)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := fresh(ctx, s, prefix+strconv.FormatInt(n.Add(1), 36)); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				trips, _ := hook.counts()
				b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/msg")
			})
		}
	}
}
