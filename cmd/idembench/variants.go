package main

import (
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The settings compared side by side: the store's auto-pipelining and the
// middleware's local cache of COMPLETED records, both on by default. Every
// case of the program that sets them goes through these three functions.

// newRedisStore returns a redisstore on rc, auto-pipelining unless
// noPipelining.
func newRedisStore(rc redis.UniversalClient, noPipelining bool) *redisstore.Store {
	s, err := redisstore.NewWithOptions(rc, redisstore.Options{DisableAutoPipelining: noPipelining})
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// idemConfig is what a benchmark sets of the owner protocol and of the
// middleware.
type idemConfig struct {
	Store        idempotency.Store
	KeyPrefix    string
	Scope        func(*message.Message) string
	LeaseTTL     time.Duration
	CompletedTTL time.Duration
}

// newIdempotency returns the middleware of cfg, with its local cache off
// when noCache.
func newIdempotency(cfg idemConfig, noCache bool) *idempotency.Middleware {
	lookups := &cacheLookups{}
	oc := idempotency.OnceConfig{Store: cfg.Store, LeaseTTL: cfg.LeaseTTL, CompletedTTL: cfg.CompletedTTL, Observer: lookups}
	if noCache {
		oc.CacheMaxBytes = -1
	}
	once, err := idempotency.NewOnce(oc)
	if err != nil {
		log.Fatal(err)
	}
	idem, err := idempotency.New(once, &idempotency.Config{KeyPrefix: cfg.KeyPrefix, Scope: cfg.Scope})
	if err != nil {
		log.Fatal(err)
	}
	cacheLookupsOf.Store(idem, lookups)
	return idem
}

// cacheLookups is an Observer that counts the cache's hits and misses.
type cacheLookups struct{ hits, misses atomic.Uint64 }

func (*cacheLookups) Outcome(context.Context, idempotency.OutcomeDetails) {}
func (*cacheLookups) StoreLatency(string, time.Duration, error)           {}
func (c *cacheLookups) CacheLookup(_ string, hit bool) {
	if hit {
		c.hits.Add(1)
	} else {
		c.misses.Add(1)
	}
}

// cacheLookupsOf holds the cacheLookups of each middleware newIdempotency
// built.
var cacheLookupsOf sync.Map

// cacheCounts returns the hits and misses of idem's local cache so far.
func cacheCounts(idem *idempotency.Middleware) (hits, misses uint64) {
	c, _ := cacheLookupsOf.Load(idem)
	l, _ := c.(*cacheLookups)
	if l == nil {
		return 0, 0
	}
	return l.hits.Load(), l.misses.Load()
}
