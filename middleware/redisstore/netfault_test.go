package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// netLease is the lease of the network fault tests: short, so that a
// partition of twice the lease takes about a second.
const netLease = 500 * time.Millisecond

// netWorld is two consumers of one stream of keys, each key delivered
// twice (a duplicate from the producer), once to each consumer, with a
// broker's at-least-once redelivery: a delivery whose Do fails goes back to
// its consumer's queue. Consumer "a" reaches Redis through a FaultProxy;
// consumer "b" directly.
type netWorld struct {
	t     *testing.T
	proxy *testserver.FaultProxy
	once  map[string]*idempotency.Once

	queues map[string]chan string
	acked  atomic.Int64

	mu        sync.Mutex
	effects   map[string]int
	active    map[string]activeRun // the run of each key whose context is live
	overlaps  []string             // a run started while another's context was live
	takeovers int                  // a run started after the previous owner's context was cancelled by lease loss
	unclean   int                  // runs whose outcome admits a later re-run: complete failed or lease lost
	runs      map[string]int       // runs of the work per consumer
	acks      map[string]int       // acked deliveries per consumer
	bDelay    time.Duration        // consumer b starts this long after a (after bAfterResets)
	// bAfterResets, when set, makes consumer b wait first until the proxy
	// has cut that many replies of consumer a: bDelay then counts from the
	// end of a's fault rather than from the start of the run.
	bAfterResets int
}

type activeRun struct {
	consumer string
	ctx      context.Context
}

func newNetWorld(t *testing.T) *netWorld {
	srv := testserver.StartRedis(t)
	w := &netWorld{
		t:       t,
		proxy:   testserver.StartFaultProxy(t, srv.Addr),
		once:    map[string]*idempotency.Once{},
		queues:  map[string]chan string{"a": make(chan string, 1024), "b": make(chan string, 1024)},
		effects: map[string]int{},
		active:  map[string]activeRun{},
		runs:    map[string]int{},
		acks:    map[string]int{},
	}
	for name, addr := range map[string]string{"a": w.proxy.Addr, "b": srv.Addr} {
		client := redis.NewClient(&redis.Options{
			Addr: addr, ContextTimeoutEnabled: true,
			DialTimeout: 100 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond,
		})
		t.Cleanup(func() { _ = client.Close() })
		store, err := redisstore.New(client)
		require.NoError(t, err)
		o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: netLease, StoreTimeout: 250 * time.Millisecond})
		require.NoError(t, err)
		w.once[name] = o
		// Load the scripts before any fault: a first call sends each
		// script's text (NOSCRIPT, then EVAL).
		_, err = o.Do(context.Background(), "warm-"+name, func(context.Context) ([]byte, error) { return nil, nil })
		require.NoError(t, err)
	}
	return w
}

// work is one run of key by consumer: it lasts d unless its context ends
// first, and has its effect only if it ran to the end with its context
// live.
func (w *netWorld) work(consumer, key string, d time.Duration) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		w.mu.Lock()
		w.runs[consumer]++
		if prev, ok := w.active[key]; ok {
			if prev.ctx.Err() == nil {
				w.overlaps = append(w.overlaps, fmt.Sprintf("%s started %s while %s's context was live", consumer, key, prev.consumer))
			} else if errors.Is(context.Cause(prev.ctx), idempotency.ErrLeaseLost) {
				w.takeovers++
			}
		}
		w.active[key] = activeRun{consumer: consumer, ctx: ctx}
		w.mu.Unlock()

		select {
		case <-time.After(d):
		case <-ctx.Done():
		}

		w.mu.Lock()
		defer w.mu.Unlock()
		if cur, ok := w.active[key]; ok && cur.ctx == ctx && ctx.Err() == nil {
			delete(w.active, key) // ended cleanly: no longer a live owner
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		w.effects[key]++
		return []byte(consumer), nil
	}
}

// run publishes keys, twice each, and runs both consumers until every
// delivery is acked or the deadline passes; during runs fault, if any.
func (w *netWorld) run(keys int, workFor time.Duration, fault func()) {
	t := w.t
	for i := range keys {
		for _, q := range w.queues {
			q <- fmt.Sprintf("key-%d", i)
		}
	}
	want := int64(2 * keys)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, consumer := range []string{"a", "a", "b", "b"} { // two handlers each
		wg.Add(1)
		go func() {
			defer wg.Done()
			if consumer == "b" {
				// b, closer to Redis, starts later, so that a runs keys of
				// its own instead of only finding b's completions.
				for w.proxy.Resets() < w.bAfterResets {
					select {
					case <-time.After(time.Millisecond):
					case <-ctx.Done():
						return
					}
				}
				select {
				case <-time.After(w.bDelay):
				case <-ctx.Done():
					return
				}
			}
			for {
				var key string
				queue := w.queues[consumer]
				select {
				case key = <-queue:
				case <-ctx.Done():
					return
				}
				res, err := w.once[consumer].Do(ctx, key, w.work(consumer, key, workFor))
				if err != nil {
					// Nacked: redelivered a little later.
					time.AfterFunc(20*time.Millisecond, func() { queue <- key })
					continue
				}
				w.mu.Lock()
				w.acks[consumer]++
				w.mu.Unlock()
				if res.Outcome == idempotency.OutcomeCompleteFailed || res.Outcome == idempotency.OutcomeLeaseLost {
					w.mu.Lock()
					w.unclean++
					w.mu.Unlock()
				}
				if w.acked.Add(1) == want {
					cancel()
				}
			}
		}()
	}
	if fault != nil {
		fault()
	}
	wg.Wait()
	require.Equal(t, want, w.acked.Load(), "every delivery acked once the fault is over")
}

// check asserts what holds under every fault: no effect ran twice while a
// lease was honoured (no run started while another run's context was live),
// every key had its effect, and an effect ran again only after a run whose
// outcome said so (COMPLETED could not be written within the lease).
func (w *netWorld) check(keys int) {
	t := w.t
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Empty(t, w.overlaps, "no run may start while another owner's context is live")
	assert.Positive(t, w.runs["a"], "consumer a, behind the fault, ran keys")
	repeats := 0
	for i := range keys {
		n := w.effects[fmt.Sprintf("key-%d", i)]
		assert.GreaterOrEqual(t, n, 1, "key-%d processed", i)
		repeats += max(n-1, 0)
	}
	assert.LessOrEqual(t, repeats, w.unclean, "an effect repeated only after a run reported complete_failed or lease_lost")
	t.Logf("acked deliveries %v, runs %v, repeated effects %d, unclean outcomes %d, takeovers after lease loss %d, proxy resets %d",
		w.acks, w.runs, repeats, w.unclean, w.takeovers, w.proxy.Resets())
}

// TestNetworkFaults runs two consumers of one duplicated stream on a
// private Redis, one of them through a loopback proxy that injects a
// network fault between it and Redis, with a 500 ms lease.
func TestNetworkFaults(t *testing.T) {
	t.Parallel()
	const keys = 40

	// Latency of 30 ms each way: every store call takes 60 ms more (a new
	// connection's handshake as much again), an eighth of the lease.
	// Everything still happens once.
	t.Run("latency", func(t *testing.T) {
		t.Parallel()
		w := newNetWorld(t)
		w.proxy.SetLatency(30 * time.Millisecond)
		w.bDelay = 500 * time.Millisecond
		w.run(keys, 20*time.Millisecond, nil)
		w.check(keys)
		w.mu.Lock()
		defer w.mu.Unlock()
		assert.Equal(t, keys, w.acks["a"], "the slow consumer acked each of its deliveries")
	})

	// Every connection of consumer a stalls for twice the lease while it
	// works: its calls time out, the client dials new connections, and the
	// stalled bytes arrive late, after the stall.
	t.Run("stalled connections", func(t *testing.T) {
		t.Parallel()
		w := newNetWorld(t)
		w.run(keys, 100*time.Millisecond, func() {
			w.waitActive("a")
			require.Positive(t, w.proxy.StallAll())
			time.Sleep(2 * netLease)
			w.proxy.ResumeAll()
		})
		w.check(keys)
	})

	// Replies to consumer a are cut in the middle and the connection reset,
	// ten times: go-redis resends, and every transition
	// is idempotent for its owner.
	//
	// go-redis resends a batch only after a back-off of MinRetryBackoff
	// (10 ms) plus a random part that doubles with each attempt, and every
	// resend meets the next reset: consumer a spends its ten resets in
	// 0.47 to 0.95 s of back-off (about 90 to 150 ms a reset, against
	// about 30 ms in all with the back-off disabled), making no call at all
	// meanwhile. Consumer b therefore gets its head start from the moment
	// the last reset is spent, not from the start of the run: a fixed
	// 200 ms one let b run all 40 keys while a was still backing off in
	// about one run in six.
	t.Run("reset mid-reply", func(t *testing.T) {
		t.Parallel()
		w := newNetWorld(t)
		const resets = 10
		for range resets {
			w.proxy.ResetMidReply()
		}
		w.bAfterResets = resets
		w.bDelay = 200 * time.Millisecond
		w.run(keys, 20*time.Millisecond, nil)
		w.check(keys)
		assert.Positive(t, w.proxy.Resets())
	})

	// Consumer a is partitioned from Redis for twice the lease while its
	// handlers run (each longer than the lease, renewing it): their contexts
	// are cancelled (lease lost) before the store lets consumer b claim
	// those keys; after the partition heals, every message is processed.
	t.Run("partition", func(t *testing.T) {
		t.Parallel()
		w := newNetWorld(t)
		const keys = 8
		w.run(keys, netLease+netLease/2, func() {
			w.waitActive("a")
			w.proxy.Partition()
			time.Sleep(2 * netLease)
			w.proxy.Heal()
		})
		w.check(keys)
		w.mu.Lock()
		defer w.mu.Unlock()
		assert.Positive(t, w.takeovers, "consumer b took over a key whose owner lost its lease in the partition")
	})
}

// waitActive waits until consumer runs a key.
func (w *netWorld) waitActive(consumer string) {
	w.t.Helper()
	require.Eventually(w.t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, r := range w.active {
			if r.consumer == consumer && r.ctx.Err() == nil {
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond, "consumer %s never ran a key", consumer)
}
