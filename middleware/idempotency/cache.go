package idempotency

import (
	"hash/maphash"
	"sync"
	"time"
	"unsafe"
)

// cacheTTL bounds how long a completed key is answered from memory, and so
// how long an operator's Delete goes unseen by a process that cached it.
const cacheTTL = time.Minute

// cacheClockMargin is taken off a claimed record's lifetime: its UpdatedAt
// is on the store's clock, assumed to agree with this host's within it.
const cacheClockMargin = time.Second

// cacheMaxShards bounds the shards; cacheMinShardBytes is a shard's least
// share of CacheMaxBytes, so a small cache has fewer shards.
const (
	cacheMaxShards     = 32
	cacheMinShardBytes = 64 << 10
)

// cacheEntryOverhead is an entry's cost beyond its key, result and fingerprint.
const cacheEntryOverhead = int(unsafe.Sizeof(cacheEntry{})) + 48

// completedCache holds COMPLETED records: an LRU bounded in bytes, sharded
// by the key's 64-bit hash, which also keys a shard's map (an eviction needs
// no key read; a lookup compares the key). A COMPLETED record changes only
// when it expires or is deleted, so an entry that lives no longer than the
// record answers as the store would.
type completedCache struct {
	seed     maphash.Seed
	shards   []cacheShard
	mask     uint64
	ttl      time.Duration
	shardMax int
}

type cacheShard struct {
	mu      sync.Mutex
	entries map[uint64]*cacheEntry // by the key's hash
	// lru is the sentinel of a ring of the entries: lru.next is the most
	// recently used, lru.prev the next to evict.
	lru                     cacheEntry
	bytes                   int
	hits, misses, evictions uint64
	// keeps two shards' mutexes off one cache line
	_ [64]byte
}

type cacheEntry struct {
	key        string
	hash       uint64
	rec        Record
	expires    time.Time
	size       int
	prev, next *cacheEntry
}

func newCompletedCache(ttl time.Duration, maxBytes int) *completedCache {
	n := 1
	for n < cacheMaxShards && maxBytes/(2*n) >= cacheMinShardBytes {
		n *= 2
	}
	c := &completedCache{seed: maphash.MakeSeed(), shards: make([]cacheShard, n), mask: uint64(n - 1), ttl: ttl, shardMax: maxBytes / n}
	for i := range c.shards {
		s := &c.shards[i]
		s.entries = map[uint64]*cacheEntry{}
		s.lru.next, s.lru.prev = &s.lru, &s.lru
	}
	return c
}

// shard returns the shard of key and key's hash.
func (c *completedCache) shard(key string) (*cacheShard, uint64) {
	h := maphash.String(c.seed, key)
	return &c.shards[h&c.mask], h
}

// get returns key's live record, read-only (see cloneRecord).
func (c *completedCache) get(key string, now time.Time) (Record, bool) {
	s, h := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[h]
	if e != nil && e.key != key {
		e = nil // another key with the same hash
	}
	if e != nil && !now.Before(e.expires) {
		s.remove(e)
		e = nil
	}
	if e == nil {
		s.misses++
		return Record{}, false
	}
	s.hits++
	s.unlink(e)
	s.pushFront(e)
	return e.rec, true
}

// put caches a copy of rec, COMPLETED, until expires or the cache's TTL.
// An entry larger than a shard's share is not cached.
func (c *completedCache) put(key string, rec Record, now, expires time.Time) {
	expires = minTime(expires, now.Add(c.ttl))
	if !now.Before(expires) {
		return
	}
	size := len(key) + len(rec.Result) + len(rec.Fingerprint) + cacheEntryOverhead
	fits := size <= c.shardMax
	if fits {
		rec = frozenRecord(rec) // its copy is made outside the lock
	}
	s, h := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.entries[h]; old != nil {
		s.remove(old)
	}
	if !fits {
		return
	}
	// Reuse the last entry evicted: nothing outside the shard points to it.
	var e *cacheEntry
	for s.bytes+size > c.shardMax {
		e = s.lru.prev
		s.remove(e)
		s.evictions++
	}
	if e == nil {
		e = new(cacheEntry)
	}
	*e = cacheEntry{key: key, hash: h, rec: rec, expires: expires, size: size}
	s.entries[h] = e
	s.bytes += size
	s.pushFront(e)
}

// stats sums the counters of the shards, for the tests.
func (c *completedCache) stats() (hits, misses, evictions uint64, entries, bytes int) {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		hits += s.hits
		misses += s.misses
		evictions += s.evictions
		entries += len(s.entries)
		bytes += s.bytes
		s.mu.Unlock()
	}
	return hits, misses, evictions, entries, bytes
}

func (s *cacheShard) remove(e *cacheEntry) {
	s.unlink(e)
	delete(s.entries, e.hash)
	s.bytes -= e.size
}

func (s *cacheShard) unlink(e *cacheEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (s *cacheShard) pushFront(e *cacheEntry) {
	e.prev, e.next = &s.lru, s.lru.next
	s.lru.next.prev = e
	s.lru.next = e
}

// frozenRecord copies rec's result and fingerprint into one allocation, each
// capped at its length so an append to one never writes into the other.
func frozenRecord(rec Record) Record {
	rec.Token = ""
	rec.LeaseExpiresAt = time.Time{}
	n := len(rec.Result) + len(rec.Fingerprint)
	if n == 0 {
		if rec.Result != nil {
			rec.Result = []byte{}
		}
		return rec
	}
	b := make([]byte, n)
	r := copy(b, rec.Result)
	copy(b[r:], rec.Fingerprint)
	if rec.Result != nil {
		rec.Result = b[:r:r]
	}
	if rec.Fingerprint != nil {
		rec.Fingerprint = b[r:n:n]
	}
	return rec
}

// cloneRecord returns rec with slices of its own, for Once.Claim and Once.Do.
func cloneRecord(rec Record) Record {
	rec.Result = cloneBytes(rec.Result)
	rec.Fingerprint = cloneBytes(rec.Fingerprint)
	return rec
}

// cloneBytes is bytes.Clone, except that a zero-length b stays zero-length
// and non-nil (a COMPLETED record's empty Result is non-nil).
func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// cacheLookup answers a claim of key from the cache; label is the Observer's.
func (o *Once) cacheLookup(key, label string) (Record, bool) {
	if o.cache == nil {
		return Record{}, false
	}
	rec, hit := o.cache.get(key, time.Now())
	if o.observer != nil {
		if label == "" {
			label = doLabel
		}
		o.observer.CacheLookup(label, hit)
	}
	return rec, hit
}

// cacheClaimed caches a COMPLETED record that refused a claim until its
// UpdatedAt plus CompletedTTL, less the clock margin; not without UpdatedAt.
func (o *Once) cacheClaimed(key string, rec Record) {
	if o.cache == nil || rec.State != StateCompleted || rec.UpdatedAt.IsZero() {
		return
	}
	o.cache.put(key, rec, time.Now(), rec.UpdatedAt.Add(o.cfg.CompletedTTL-cacheClockMargin))
}

// cacheCompleted caches the record this process completed, until sent plus
// CompletedTTL: the store counted from no earlier, so the entry ends first.
func (l *Lease) cacheCompleted(result []byte, sent time.Time) {
	o := l.o
	if o.cache == nil {
		return
	}
	if result == nil {
		result = []byte{}
	}
	rec := Record{State: StateCompleted, Attempts: l.record.attempts, Result: result, Fingerprint: l.record.fingerprint,
		CreatedAt: l.record.created, UpdatedAt: sent}
	o.cache.put(l.dv.key, rec, time.Now(), sent.Add(o.cfg.CompletedTTL))
}
