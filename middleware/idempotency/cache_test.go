package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// commandCounter is a go-redis hook that counts the commands a client sends.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// countedRedisStore is a store on the shared Redis, as one process of its
// own would have it (its own client), with the commands it sends counted.
func countedRedisStore(t *testing.T) (idempotency.Store, *commandCounter) {
	t.Helper()
	client := testserver.RedisClient(t)
	commands := &commandCounter{}
	client.AddHook(commands)
	store, err := redisstore.New(client)
	require.NoError(t, err)
	return store, commands
}

// cacheObs is an Observer and CacheObserver that records every lookup.
type cacheObs struct {
	*outcomes
	mu      sync.Mutex
	lookups map[string][2]int // handler: misses, hits
}

func newCacheObs() *cacheObs { return &cacheObs{outcomes: newOutcomes(), lookups: map[string][2]int{}} }

func (o *cacheObs) CacheLookup(handler string, hit bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.lookups[handler]
	if hit {
		l[1]++
	} else {
		l[0]++
	}
	o.lookups[handler] = l
}

func (o *cacheObs) lookupsOf(handler string) (misses, hits int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.lookups[handler]
	return l[0], l[1]
}

var _ idempotency.Observer = (*cacheObs)(nil)

// producing is a handler that produces one message, so that a duplicate's
// replayed output can be compared with the first run's.
func producing(c *counter) message.HandlerFunc {
	c.outputs = func(msg *message.Message) []*message.Message {
		out := message.NewMessage(watermill.NewUUID(), []byte("out of "+msg.Metadata.Get("requestId")))
		out.Metadata.Set("k", "v")
		return []*message.Message{out}
	}
	return c.handle
}

// TestCacheDuplicateSendsNoRedisCommand: once a process completed a key, a
// duplicate is answered from memory, with the stored output and its UUIDs,
// and not one command reaches Redis.
func TestCacheDuplicateSendsNoRedisCommand(t *testing.T) {
	store, commands := countedRedisStore(t)
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: "test-" + watermill.NewShortUUID()})
	h := &counter{}
	chain := idem.Middleware(producing(h))

	first, err := chain(newMsg("req-1", "p"))
	require.NoError(t, err)
	require.Len(t, first, 1)
	sent := commands.n.Load()
	require.Positive(t, sent, "the first delivery went to Redis")

	for range 3 {
		again, err := chain(newMsg("req-1", "p"))
		require.NoError(t, err)
		require.Len(t, again, 1)
		assert.Equal(t, first[0].UUID, again[0].UUID, "the stored output, with its UUID")
		assert.Equal(t, first[0].Payload, again[0].Payload)
		assert.Equal(t, "v", again[0].Metadata.Get("k"))
	}
	assert.Equal(t, sent, commands.n.Load(), "no Redis command for a duplicate with a warm cache")
	assert.EqualValues(t, 1, h.runs.Load())
	assert.Equal(t, 3, obs.get(idempotency.OutcomeDuplicate))
	assert.Equal(t, 1, obs.op("claim"), "one claim: the first delivery's")
}

// TestCacheLearnsCompletedFromAClaim: a process whose claim finds the key
// COMPLETED by another one keeps the record, and answers the next copy
// from memory, fingerprint comparison included.
func TestCacheLearnsCompletedFromAClaim(t *testing.T) {
	prefix := "test-" + watermill.NewShortUUID()
	storeA, _ := countedRedisStore(t)
	storeB, commandsB := countedRedisStore(t)
	a, _ := newIdem(t, testConfig{Store: storeA, KeyPrefix: prefix, CheckPayload: true})
	b, obsB := newIdem(t, testConfig{Store: storeB, KeyPrefix: prefix, CheckPayload: true})
	h := &counter{}
	first, err := a.Middleware(producing(h))(newMsg("req-1", "pay 10"))
	require.NoError(t, err)

	before := commandsB.n.Load()
	got, err := b.Middleware(h.handle)(newMsg("req-1", "pay 10"))
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, first[0].UUID, got[0].UUID)
	assert.Greater(t, commandsB.n.Load(), before, "the first copy at B claims in Redis")
	assert.Equal(t, 1, b.CacheStats().Entries, "and B keeps the COMPLETED record it found")

	before = commandsB.n.Load()
	got, err = b.Middleware(h.handle)(newMsg("req-1", "pay 10"))
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, first[0].UUID, got[0].UUID)
	_, err = b.Middleware(h.handle)(newMsg("req-1", "pay 99"))
	require.ErrorIs(t, err, idempotency.ErrKeyReused, "the cached record keeps its fingerprint")
	assert.Equal(t, before, commandsB.n.Load(), "both answered from B's memory")
	assert.EqualValues(t, 1, h.runs.Load())
	assert.Equal(t, 2, obsB.get(idempotency.OutcomeDuplicate))
	assert.Equal(t, 1, obsB.get(idempotency.OutcomeKeyReused))
}

// TestCacheCountsHitsAndMisses: CacheStats and a CacheObserver see every
// lookup, labelled with the handler (the middleware) or OnceConfig.Name.
func TestCacheCountsHitsAndMisses(t *testing.T) {
	store, _ := sharedRedisStore(t)
	obs := newCacheObs()
	idem, _ := newIdem(t, testConfig{Store: store, KeyPrefix: "test-" + watermill.NewShortUUID(), Observer: obs,
		Scope: func(*message.Message) string { return "orders" }})
	chain := idem.Middleware((&counter{}).handle)
	for _, key := range []string{"a", "b", "a", "a", "b", "c"} {
		_, err := chain(newMsg(key, "p"))
		require.NoError(t, err)
	}
	st := idem.CacheStats()
	assert.EqualValues(t, 3, st.Misses, "a, b and c were new")
	assert.EqualValues(t, 3, st.Hits, "a twice, b once")
	assert.Equal(t, 3, st.Entries)
	assert.Positive(t, st.Bytes)
	assert.Zero(t, st.Evictions)
	misses, hits := obs.lookupsOf("orders")
	assert.Equal(t, 3, misses)
	assert.Equal(t, 3, hits)

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs})
	require.NoError(t, err)
	key := "test-" + watermill.NewShortUUID()
	for range 2 {
		_, err := once.Do(context.Background(), key, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
	}
	_, _, err = once.Claim(context.Background(), key, nil)
	require.NoError(t, err)
	misses, hits = obs.lookupsOf("once")
	assert.Equal(t, 1, misses)
	assert.Equal(t, 2, hits, "Do and Claim are labelled \"once\"")
	assert.Equal(t, idempotency.CacheStats{Hits: 2, Misses: 1, Entries: 1, Bytes: once.CacheStats().Bytes}, once.CacheStats())
}

// TestCacheNeverOutlivesCompletedTTL: with a CompletedTTL shorter than the
// cache's, an entry ends with the record, for a key completed here and for
// one read from a claim, and the next delivery runs the handler again.
func TestCacheNeverOutlivesCompletedTTL(t *testing.T) {
	prefix := "test-" + watermill.NewShortUUID()
	storeA, _ := countedRedisStore(t)
	storeB, _ := countedRedisStore(t)
	// B reads the record from a claim: its entry ends a clock margin (1 s)
	// before UpdatedAt + CompletedTTL, so the record must live longer.
	const completed = 1500 * time.Millisecond
	cfg := testConfig{KeyPrefix: prefix, CompletedTTL: completed}
	cfg.Store = storeA
	a, obsA := newIdem(t, cfg)
	cfg.Store = storeB
	b, obsB := newIdem(t, cfg)
	h := &counter{}
	_, err := a.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	_, err = b.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	require.Equal(t, 1, b.CacheStats().Entries, "B cached the record its claim found")
	require.EqualValues(t, 1, h.runs.Load())

	time.Sleep(completed + 50*time.Millisecond) // the record expired in Redis
	_, err = a.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load(), "A's entry ended with the record: the handler ran again")
	assert.Equal(t, 2, obsA.get(idempotency.OutcomeProcessed))
	assert.Equal(t, 1, obsB.get(idempotency.OutcomeDuplicate))

	// A completed the key anew; B's old entry ended before the first
	// record did, so B reads the new one from Redis.
	_, err = b.Middleware(h.handle)(newMsg("req-1", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load())
	assert.Equal(t, 2, obsB.get(idempotency.OutcomeDuplicate))
	assert.EqualValues(t, 2, b.CacheStats().Misses, "B's second copy was a miss: its entry had ended")
}

// TestCacheOperatorDeleteIsSeenAfterCacheTTL documents the one exception
// to COMPLETED being final: an operator deletes a completed key; a process
// that never cached it runs the work again at once, the process that
// cached it only once its entry ends (CacheTTL).
func TestCacheOperatorDeleteIsSeenAfterCacheTTL(t *testing.T) {
	storeA, _ := sharedRedisStore(t)
	storeB, _ := sharedRedisStore(t)
	const cacheTTL = 400 * time.Millisecond
	a, err := idempotency.NewOnceWithCacheTTL(idempotency.OnceConfig{Store: storeA}, cacheTTL)
	require.NoError(t, err)
	b, err := idempotency.NewOnceWithCacheTTL(idempotency.OnceConfig{Store: storeB}, cacheTTL)
	require.NoError(t, err)
	key := "test-" + watermill.NewShortUUID()
	var runs atomic.Int32
	succeed := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("v"), nil }
	fail := func(context.Context) ([]byte, error) { runs.Add(1); return nil, errHandler }

	_, err = a.Do(context.Background(), key, succeed)
	require.NoError(t, err)
	require.NoError(t, storeA.Delete(context.Background(), key)) // idemctl purge, or Store.Delete

	_, err = b.Do(context.Background(), key, fail)
	require.ErrorIs(t, err, errHandler, "B never cached the key: it runs the work at once")
	res, err := a.Do(context.Background(), key, succeed)
	require.NoError(t, err)
	assert.Equal(t, idempotency.OutcomeDuplicate, res.Outcome, "A still answers from its cache")
	assert.Equal(t, []byte("v"), res.Value)
	assert.EqualValues(t, 2, runs.Load())

	time.Sleep(cacheTTL)
	res, err = a.Do(context.Background(), key, succeed)
	require.NoError(t, err)
	assert.NotEqual(t, idempotency.OutcomeDuplicate, res.Outcome, "after CacheTTL, A sees the deletion too")
	assert.EqualValues(t, 3, runs.Load())
}

// TestCacheEvictsWithinMaxBytes: many completed keys on a small cache keep
// it within CacheMaxBytes, evicting the least recently used.
func TestCacheEvictsWithinMaxBytes(t *testing.T) {
	store, _ := sharedRedisStore(t)
	const maxBytes = 64 << 10
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, CacheMaxBytes: maxBytes})
	require.NoError(t, err)
	prefix := "test-" + watermill.NewShortUUID()
	value := []byte(strings.Repeat("x", 1000))
	for i := range 200 { // 200 kB of results
		_, err := once.Do(context.Background(), fmt.Sprintf("%s:%d", prefix, i), func(context.Context) ([]byte, error) { return value, nil })
		require.NoError(t, err)
		require.LessOrEqual(t, once.CacheStats().Bytes, maxBytes)
	}
	st := once.CacheStats()
	assert.Positive(t, st.Evictions)
	assert.Less(t, st.Entries, 64)
	assert.Greater(t, st.Entries, 40, "the cache is used up to its bound")
	assert.EqualValues(t, 200, int(st.Evictions)+st.Entries)

	res, err := once.Do(context.Background(), prefix+":199", func(context.Context) ([]byte, error) { return nil, errHandler })
	require.NoError(t, err)
	assert.Equal(t, idempotency.OutcomeDuplicate, res.Outcome)
	assert.EqualValues(t, 1, once.CacheStats().Hits, "the most recent key is still cached")
	res, err = once.Do(context.Background(), prefix+":0", func(context.Context) ([]byte, error) { return nil, errHandler })
	require.NoError(t, err)
	assert.Equal(t, idempotency.OutcomeDuplicate, res.Outcome, "an evicted key is answered by the store")
	assert.EqualValues(t, 1, once.CacheStats().Hits)

	st = once.CacheStats()
	big := []byte(strings.Repeat("y", maxBytes))
	_, err = once.Do(context.Background(), prefix+":big", func(context.Context) ([]byte, error) { return big, nil })
	require.NoError(t, err)
	assert.LessOrEqual(t, once.CacheStats().Bytes, maxBytes, "an entry larger than the cache is not cached")
	assert.Equal(t, st.Evictions, once.CacheStats().Evictions, "and evicts nothing")
}

// TestCacheDisabledGoesToTheStoreEveryTime: DisableCache claims every copy
// in Redis, so an operator's Delete is seen at once.
func TestCacheDisabledGoesToTheStoreEveryTime(t *testing.T) {
	store, commands := countedRedisStore(t)
	obs := newCacheObs()
	idem, _ := newIdem(t, testConfig{Store: store, KeyPrefix: "test-" + watermill.NewShortUUID(), CacheMaxBytes: -1, Observer: obs})
	h := &counter{}
	chain := idem.Middleware(h.handle)
	msg := newMsg("req-1", "p")
	_, err := chain(msg)
	require.NoError(t, err)
	for range 3 {
		before := commands.n.Load()
		_, err := chain(newMsg("req-1", "p"))
		require.NoError(t, err)
		assert.Greater(t, commands.n.Load(), before, "every copy is claimed in Redis")
	}
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	require.NoError(t, store.Delete(context.Background(), key))
	_, err = chain(newMsg("req-1", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load(), "the deletion is seen at once")
	assert.Equal(t, idempotency.CacheStats{}, idem.CacheStats())
	misses, hits := obs.lookupsOf("")
	assert.Zero(t, misses+hits, "no lookup is reported")
}

// TestCacheSkipsInProcessStores: memstore answers from memory already.
func TestCacheSkipsInProcessStores(t *testing.T) {
	obs := newCacheObs()
	idem, _ := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), Observer: obs})
	chain := idem.Middleware((&counter{}).handle)
	for range 3 {
		_, err := chain(newMsg("req-1", "p"))
		require.NoError(t, err)
	}
	assert.Equal(t, 3, obs.op("claim"), "every copy claimed in the store")
	assert.Equal(t, idempotency.CacheStats{}, idem.CacheStats())
}

// TestCachedResultIsNeverChangedByCallers: what a duplicate gets (produced
// messages, Do's value, Claim's record) is the caller's own: changing it
// changes nothing for the next duplicate.
func TestCachedResultIsNeverChangedByCallers(t *testing.T) {
	store, _ := sharedRedisStore(t)
	idem, _ := newIdem(t, testConfig{Store: store, KeyPrefix: "test-" + watermill.NewShortUUID()})
	chain := idem.Middleware(producing(&counter{}))
	first, err := chain(newMsg("req-1", "p"))
	require.NoError(t, err)
	want := string(first[0].Payload)
	for range 2 {
		dup, err := chain(newMsg("req-1", "p"))
		require.NoError(t, err)
		assert.Equal(t, want, string(dup[0].Payload))
		dup[0].Payload[0] = 'X'
		dup[0].Metadata.Set("k", "changed")
	}
	require.EqualValues(t, 2, idem.CacheStats().Hits)

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	key := "test-" + watermill.NewShortUUID()
	value := []byte("value")
	_, err = once.Do(context.Background(), key, func(context.Context) ([]byte, error) { return value, nil })
	require.NoError(t, err)
	value[0] = 'X' // the work's own slice, changed after Do returned
	for range 2 {
		res, err := once.Do(context.Background(), key, func(context.Context) ([]byte, error) { return nil, errHandler })
		require.NoError(t, err)
		assert.Equal(t, "value", string(res.Value))
		res.Value[0] = 'X'
		_, claim, err := once.Claim(context.Background(), key, nil)
		require.NoError(t, err)
		assert.Equal(t, "value", string(claim.Record.Result))
		claim.Record.Result[0] = 'X'
	}
	assert.EqualValues(t, 4, once.CacheStats().Hits)
}

// TestCacheConcurrentDuplicates runs 64 goroutines over a few keys on
// Redis: each key's work runs once, and most copies are cache hits (run
// with -race).
func TestCacheConcurrentDuplicates(t *testing.T) {
	store, _ := sharedRedisStore(t)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, CacheMaxBytes: 64 << 10})
	require.NoError(t, err)
	prefix := "test-" + watermill.NewShortUUID()
	effects := newLedger()
	const keys, goroutines, rounds = 16, 64, 50
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for r := range rounds {
				key := fmt.Sprintf("key-%d", (g+r)%keys)
				for {
					res, err := once.Do(context.Background(), prefix+":"+key, func(context.Context) ([]byte, error) {
						effects.record(key)
						return []byte(key), nil
					})
					if errors.Is(err, idempotency.ErrInProgress) {
						time.Sleep(time.Millisecond)
						continue
					}
					if assert.NoError(t, err) {
						assert.Equal(t, key, string(res.Value))
					}
					break
				}
			}
		})
	}
	wg.Wait()
	effects.exactlyOnce(t, keys)
	st := once.CacheStats()
	assert.Greater(t, st.Hits, uint64(goroutines*rounds/2), "%+v", st)
	assert.Equal(t, keys, st.Entries)
}

// TestCacheEntryLifetime, on synctest's clock: an entry of a key completed
// here ends CacheTTL later, or CompletedTTL after its Complete was sent
// when that is sooner; one read from a claim ends CompletedTTL after the
// record's UpdatedAt, less the clock margin; a record without UpdatedAt
// is not cached.
func TestCacheEntryLifetime(t *testing.T) {
	do := func(t *testing.T, once *idempotency.Once, key string) idempotency.Result {
		t.Helper()
		res, err := once.Do(context.Background(), key, func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
		return res
	}
	t.Run("CacheTTL", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := faultstore.New(memstore.New(memstore.Config{})) // not in process: timed and cached like a networked store
			once, err := idempotency.NewOnceWithCacheTTL(idempotency.OnceConfig{Store: store}, 10*time.Second)
			require.NoError(t, err)
			do(t, once, "k")
			time.Sleep(10*time.Second - time.Nanosecond)
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome)
			assert.EqualValues(t, 1, once.CacheStats().Hits)
			time.Sleep(time.Nanosecond)
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome, "the store still holds it")
			assert.EqualValues(t, 1, once.CacheStats().Hits, "the entry ended after CacheTTL")
			assert.EqualValues(t, 2, once.CacheStats().Misses)
		})
	})
	t.Run("CompletedTTL", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := faultstore.New(memstore.New(memstore.Config{})) // not in process: timed and cached like a networked store
			once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, CompletedTTL: 5 * time.Second})
			require.NoError(t, err)
			do(t, once, "k")
			time.Sleep(5*time.Second - time.Nanosecond)
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome)
			assert.EqualValues(t, 1, once.CacheStats().Hits)
			time.Sleep(time.Nanosecond)
			assert.NotEqual(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome, "the entry ended with the record")
		})
	})
	t.Run("from a claim", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := faultstore.New(memstore.New(memstore.Config{})) // not in process: timed and cached like a networked store
			cfg := idempotency.OnceConfig{Store: store, CompletedTTL: 5 * time.Second}
			other, err := idempotency.NewOnce(cfg)
			require.NoError(t, err)
			once, err := idempotency.NewOnce(cfg)
			require.NoError(t, err)
			do(t, other, "k")
			time.Sleep(time.Second)
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome)
			require.Equal(t, 1, once.CacheStats().Entries, "the record was cached")
			time.Sleep(3*time.Second - time.Nanosecond) // UpdatedAt + CompletedTTL - 1 s, less a nanosecond
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome)
			assert.EqualValues(t, 1, once.CacheStats().Hits)
			time.Sleep(time.Nanosecond)
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome, "the store still holds it")
			assert.EqualValues(t, 1, once.CacheStats().Hits, "the entry ended a second before the record")
		})
	})
	t.Run("without UpdatedAt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := noUpdatedAt{memstore.New(memstore.Config{})}
			other, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
			require.NoError(t, err)
			once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
			require.NoError(t, err)
			do(t, other, "k")
			assert.Equal(t, idempotency.OutcomeDuplicate, do(t, once, "k").Outcome)
			assert.Zero(t, once.CacheStats().Entries, "a record of unknown age is not cached")
		})
	})
}

// noUpdatedAt is a store whose claims leave UpdatedAt zero.
type noUpdatedAt struct{ idempotency.Store }

func (s noUpdatedAt) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, key, req)
	res.Record.UpdatedAt = time.Time{}
	return res, err
}

// TestCacheNotWrittenWhenCompleteFails: only a COMPLETED the store took is
// cached; a lost lease or an unreachable store leaves the key to the store.
func TestCacheNotWrittenWhenCompleteFails(t *testing.T) {
	store, _ := sharedRedisStore(t)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	key := "test-" + watermill.NewShortUUID()
	res, err := once.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
		require.NoError(t, store.Delete(ctx, key)) // an operator deletes it under the running work
		return []byte("v"), nil
	})
	require.NoError(t, err)
	require.Equal(t, idempotency.OutcomeLeaseLost, res.Outcome)
	assert.Zero(t, once.CacheStats().Entries)
	res, err = once.Do(context.Background(), key, func(context.Context) ([]byte, error) { return []byte("w"), nil })
	require.NoError(t, err)
	assert.NotEqual(t, idempotency.OutcomeDuplicate, res.Outcome, "the next call runs the work")
}

// TestCacheConfig: a negative CacheMaxBytes turns the cache off; zero is
// its default.
func TestCacheConfig(t *testing.T) {
	store := faultstore.New(memstore.New(memstore.Config{})) // not in process: timed and cached like a networked store
	off, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, CacheMaxBytes: -1})
	require.NoError(t, err)
	_, err = off.Do(context.Background(), "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
	require.NoError(t, err)
	_, err = off.Do(context.Background(), "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
	require.NoError(t, err)
	assert.Equal(t, idempotency.CacheStats{}, off.CacheStats(), "no cache")
	assert.EqualValues(t, 2, store.Calls("claim"), "both calls claimed in the store")

	on, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	assert.Equal(t, idempotency.DefaultCacheMaxBytes, on.Config().CacheMaxBytes)
}

// TestCacheOwnCompletionKeepsFingerprint: a key completed here is cached
// with its payload's fingerprint, so a different payload under it is
// ErrKeyReused from memory, as from the store.
func TestCacheOwnCompletionKeepsFingerprint(t *testing.T) {
	store, commands := countedRedisStore(t)
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: "test-" + watermill.NewShortUUID(), CheckPayload: true})
	chain := idem.Middleware((&counter{}).handle)
	_, err := chain(newMsg("req-1", "pay 10"))
	require.NoError(t, err)
	before := commands.n.Load()
	_, err = chain(newMsg("req-1", "pay 99"))
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	_, err = chain(newMsg("req-1", "pay 10"))
	require.NoError(t, err)
	assert.Equal(t, before, commands.n.Load(), "both answered from memory")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeKeyReused))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate))
}
