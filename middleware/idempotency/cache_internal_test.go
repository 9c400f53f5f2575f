package idempotency

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func completedWith(result string) Record {
	return Record{State: StateCompleted, Attempts: 1, Result: []byte(result), Fingerprint: []byte("fp")}
}

// TestCacheLRU: one shard (a small cache) evicts the least recently used
// entry first, a lookup refreshes an entry, and the bytes counted are the
// key's, the result's, the fingerprint's and the overhead.
func TestCacheLRU(t *testing.T) {
	const entry = 1000 // key "k0".."k9" (2 bytes) + result + fingerprint (2) + overhead
	result := strings.Repeat("r", entry-4-cacheEntryOverhead)
	c := newCompletedCache(time.Hour, 5*entry)
	require.Len(t, c.shards, 1)
	now := time.Now()
	for i := range 5 {
		c.put(fmt.Sprintf("k%d", i), completedWith(result), now, now.Add(time.Hour))
	}
	assert.Equal(t, CacheStats{Entries: 5, Bytes: 5 * entry}, c.st())
	_, ok := c.get("k0", now) // k0 is now the most recent; k1 the least
	require.True(t, ok)
	c.put("k5", completedWith(result), now, now.Add(time.Hour))
	_, ok = c.get("k1", now)
	assert.False(t, ok, "the least recently used entry was evicted")
	for _, k := range []string{"k0", "k2", "k3", "k4", "k5"} {
		_, ok := c.get(k, now)
		assert.True(t, ok, k)
	}
	assert.Equal(t, CacheStats{Hits: 6, Misses: 1, Evictions: 1, Entries: 5, Bytes: 5 * entry}, c.st())

	c.put("huge", completedWith(strings.Repeat("h", 5*entry)), now, now.Add(time.Hour))
	_, ok = c.get("huge", now)
	assert.False(t, ok, "an entry larger than the shard is not cached")
	assert.EqualValues(t, 1, c.st().Evictions, "and evicts nothing")

	c.put("k0", completedWith("short"), now, now.Add(time.Hour)) // replaced, not added
	rec, ok := c.get("k0", now)
	require.True(t, ok)
	assert.Equal(t, "short", string(rec.Result))
	assert.Equal(t, 4*entry+2+5+2+cacheEntryOverhead, c.st().Bytes)
}

// TestCacheExpiry: an entry ends at its expiry, or the cache's TTL,
// whichever is sooner, and one already over is not cached.
func TestCacheExpiry(t *testing.T) {
	c := newCompletedCache(time.Minute, DefaultCacheMaxBytes)
	now := time.Now()
	c.put("a", completedWith(""), now, now.Add(time.Hour))
	c.put("b", completedWith(""), now, now.Add(time.Second))
	c.put("c", completedWith(""), now, now)
	for _, tc := range []struct {
		key  string
		at   time.Duration
		live bool
	}{{"a", time.Minute - 1, true}, {"a", time.Minute, false}, {"b", time.Second - 1, true}, {"b", time.Second, false}, {"c", 0, false}} {
		_, ok := c.get(tc.key, now.Add(tc.at))
		assert.Equal(t, tc.live, ok, "%s at %v", tc.key, tc.at)
	}
	assert.Zero(t, c.st().Entries, "expired entries are removed when looked up")
	assert.Zero(t, c.st().Bytes)
}

// TestCacheShards: the default cache has enough shards for 64 goroutines
// not to queue on one mutex; a small one fewer, each holding 64 KiB.
func TestCacheShards(t *testing.T) {
	for _, tc := range []struct{ bytes, shards int }{{DefaultCacheMaxBytes, 32}, {2 << 20, 32}, {1 << 20, 16}, {128 << 10, 2}, {64 << 10, 1}, {1, 1}} {
		c := newCompletedCache(time.Minute, tc.bytes)
		assert.Equal(t, tc.shards, len(c.shards), "%d bytes", tc.bytes)
		assert.Equal(t, tc.bytes/tc.shards, c.shardMax, "%d bytes", tc.bytes)
	}
}

// TestFrozenRecord: an entry owns its bytes, and an append to its result
// cannot write into its fingerprint; an empty result stays non-nil.
func TestFrozenRecord(t *testing.T) {
	rec := Record{State: StateCompleted, Token: "t", Result: []byte("res"), Fingerprint: []byte("fp")}
	frozen := frozenRecord(rec)
	rec.Result[0], rec.Fingerprint[0] = 'X', 'X'
	assert.Equal(t, "res", string(frozen.Result))
	assert.Equal(t, "fp", string(frozen.Fingerprint))
	assert.Empty(t, frozen.Token)
	_ = append(frozen.Result, 'Z')
	assert.Equal(t, "fp", string(frozen.Fingerprint))

	empty := frozenRecord(Record{State: StateCompleted, Result: []byte{}})
	assert.NotNil(t, empty.Result)
	assert.Nil(t, empty.Fingerprint)
	assert.NotNil(t, cloneBytes([]byte{}))
	assert.Nil(t, cloneBytes(nil))
}

// TestCacheConcurrent: 64 goroutines putting and getting overlapping keys
// (run with -race) leave the shards' counts consistent and within bounds.
func TestCacheConcurrent(t *testing.T) {
	const maxBytes = 256 << 10
	c := newCompletedCache(time.Hour, maxBytes)
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			now := time.Now()
			for i := range 2000 {
				key := fmt.Sprintf("k%d", (g*7+i)%500)
				if _, ok := c.get(key, now); !ok {
					c.put(key, completedWith(strings.Repeat("v", i%300)), now, now.Add(time.Hour))
				}
			}
		})
	}
	wg.Wait()
	st := c.st()
	assert.LessOrEqual(t, st.Bytes, maxBytes)
	assert.EqualValues(t, 64*2000, st.Hits+st.Misses)
	n, bytes := 0, 0
	for i := range c.shards {
		s := &c.shards[i]
		for e := s.lru.next; e != &s.lru; e = e.next {
			n++
			bytes += e.size
			assert.Same(t, e, s.entries[e.hash])
		}
	}
	assert.Equal(t, st.Entries, n, "the LRU rings hold every entry of the maps")
	assert.Equal(t, st.Bytes, bytes)
}

// TestCacheFullAnswersEachKeyItsOwn: a full cache evicts an entry per put
// and holds the new record in the evicted entry's place; every key still
// cached answers its own record, and a record a lookup returned before is
// not changed by the puts that follow.
func TestCacheFullAnswersEachKeyItsOwn(t *testing.T) {
	c := newCompletedCache(time.Hour, 64<<10)
	require.Len(t, c.shards, 1)
	now := time.Now()
	record := func(i int) Record {
		return Record{State: StateCompleted, Attempts: i, Result: []byte(fmt.Sprintf("r%d", i)), Fingerprint: []byte(fmt.Sprintf("f%d", i)),
			CreatedAt: now.Add(-time.Duration(i) * time.Second), UpdatedAt: now.Add(-time.Duration(i) * time.Millisecond)}
	}
	const keys = 2000
	c.put("k0", record(0), now, now.Add(time.Hour))
	first, ok := c.get("k0", now)
	require.True(t, ok)
	for i := 1; i < keys; i++ {
		c.put(fmt.Sprintf("k%d", i), record(i), now, now.Add(time.Hour))
	}
	st := c.st()
	require.NotZero(t, st.Evictions, "the cache filled up")
	hits := 0
	for i := range keys {
		got, ok := c.get(fmt.Sprintf("k%d", i), now)
		if !ok {
			continue
		}
		hits++
		assert.Equal(t, record(i), got, "k%d", i)
	}
	assert.Equal(t, st.Entries, hits, "every entry answers its own key")
	assert.Equal(t, record(0), first, "what a lookup returned stays as it was")
}
