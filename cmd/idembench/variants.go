package main

import (
	"log"

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
	s, err := redisstore.New(rc, &redisstore.Options{DisableAutoPipelining: noPipelining})
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// newIdempotency returns the middleware of cfg, with its local cache off
// when noCache.
func newIdempotency(cfg idempotency.Config, noCache bool) *idempotency.Middleware {
	cfg.DisableCache = noCache
	idem, err := idempotency.New(cfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	return idem
}

// cacheCounts returns the hits and misses of idem's local cache so far.
func cacheCounts(idem *idempotency.Middleware) (hits, misses uint64) {
	st := idem.CacheStats()
	return uint64(st.Hits), uint64(st.Misses)
}
