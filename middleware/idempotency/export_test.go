package idempotency

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Config returns the configuration in force, defaults filled, for the tests
// of the defaults.
func (d *Middleware) Config() Config { return d.cfg }

// StoreKey returns the key under which msg's state is stored, for the tests
// that look at records.
func (d *Middleware) StoreKey(msg *message.Message) (string, error) {
	return d.storeKey(msg, d.cfg.Scope(msg))
}

// CacheStats are the counters of a Once's cache of COMPLETED records, for
// the tests of the cache; all zero when it is off.
type CacheStats struct {
	Hits, Misses, Evictions uint64
	Entries, Bytes          int
}

// CacheStats returns the counters of o's cache.
func (o *Once) CacheStats() CacheStats {
	if o.cache == nil {
		return CacheStats{}
	}
	return o.cache.st()
}

// CacheStats returns the counters of the middleware's Once's cache.
func (d *Middleware) CacheStats() CacheStats { return d.once.CacheStats() }

// st is stats as one value, for the internal tests of the cache.
func (c *completedCache) st() CacheStats {
	var s CacheStats
	s.Hits, s.Misses, s.Evictions, s.Entries, s.Bytes = c.stats()
	return s
}

// The defaults, for the tests that check them.
const (
	DefaultLeaseTTL      = defaultLeaseTTL
	DefaultCompletedTTL  = defaultCompletedTTL
	DefaultFailedTTL     = defaultFailedTTL
	DefaultStoreTimeout  = defaultStoreTimeout
	DefaultMaxOutputSize = defaultMaxOutputSize
	DefaultCacheMaxBytes = defaultCacheMaxBytes
	DefaultCacheTTL      = cacheTTL
	DefaultKeyPrefix     = defaultKeyPrefix
	DefaultNackDelay     = defaultNackDelay
	DefaultMaxKeyLength  = 200
)

// NewOnceWithCacheTTL is NewOnce with a cache whose entries live at most
// ttl instead of a minute, for the tests that wait for an entry to end on
// a real store's clock.
func NewOnceWithCacheTTL(cfg OnceConfig, ttl time.Duration) (*Once, error) {
	o, err := NewOnce(cfg)
	if err == nil && o.cache != nil {
		o.cache = newCompletedCache(ttl, o.cfg.CacheMaxBytes)
	}
	return o, err
}

// ErrOutputNotStored is the error reported with OutcomeOutputNotStored.
var ErrOutputNotStored = errOutputNotStored
