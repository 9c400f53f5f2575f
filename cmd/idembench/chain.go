package main

import (
	"log"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/benchref"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// Rate is one measured throughput.
type Rate struct {
	Section     string  `json:"section"`
	Broker      string  `json:"broker,omitempty"`
	Dedup       string  `json:"dedup"`
	Load        string  `json:"load"` // fresh or duplicate
	Concurrency int     `json:"concurrency"`
	Messages    int64   `json:"messages"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"per_second"`
	// CacheHits and CacheMisses count the lookups of the middleware's local
	// cache during the measurement (chain cases of ours whose cache is on).
	CacheHits   uint64 `json:"cache_hits,omitempty"`
	CacheMisses uint64 `json:"cache_misses,omitempty"`
	// ClientCPU and RedisCPU are the CPU microseconds per message of this
	// process (every goroutine: the router, the broker's client, the
	// middleware) and of the Redis the store uses (its main thread), from
	// the router's start to its close (e2e section); zero where it could
	// not be read (no getrusage, or Redis's INFO unanswered).
	ClientCPU float64 `json:"client_cpu_usec,omitempty"`
	RedisCPU  float64 `json:"redis_cpu_usec,omitempty"`
	// RedisReads is how many reads Redis processed per message in the same
	// span (INFO's total_reads_processed): each is one batch that a
	// connection delivered, so fewer reads per message mean larger batches.
	RedisReads float64 `json:"redis_reads,omitempty"`
	Note       string  `json:"note,omitempty"`
}

func noop(*message.Message) ([]*message.Message, error) { return nil, nil }

// chainDedups names the middlewares of the chain section, in table order.
// redisstore is ours with the defaults (auto-pipelining and the local cache
// on); redisstore-nopipeline and redisstore-nocache turn one of them off.
// pgstore-tx is ours on PostgreSQL with a handler that books a row and
// completes in its own transaction (BEGIN, INSERT, CompleteInTx, COMMIT):
// it does work the others' handlers do not. mysqlstore and mysqlstore-tx
// are the same on MySQL.
var chainDedups = []string{"none", "watermill", "memstore", "redisstore", "redisstore-nopipeline", "redisstore-nocache",
	"pgstore", "pgstore-tx", "mysqlstore", "mysqlstore-tx", "naiveredis"}

// needsPG says which chains run on PostgreSQL, left out without -pg;
// needsMySQL those on MySQL, left out without -mysql.
var (
	needsPG    = map[string]bool{"pgstore": true, "pgstore-tx": true}
	needsMySQL = map[string]bool{"mysqlstore": true, "mysqlstore-tx": true}
)

// chainCase is one middleware of the chain section around a handler that
// does nothing (pgstore-tx's books a row).
type chainCase struct {
	handler message.HandlerFunc
	// idem is ours, nil for the others.
	idem  *idempotency.Middleware
	close func()
}

func buildChain(name string, rc *redis.Client, pg *pgBench, my *mysqlBench, prefix string) chainCase {
	ours := func(s idempotency.Store, noCache bool, h message.HandlerFunc, closeFn func()) chainCase {
		idem := newIdempotency(idemConfig{Store: s, KeyPrefix: prefix, CompletedTTL: time.Hour}, noCache)
		return chainCase{handler: idem.Middleware(h), idem: idem, close: closeFn}
	}
	switch name {
	case "none":
		return chainCase{handler: noop, close: func() {}}
	case "watermill":
		repo, err := wmmiddleware.NewMapExpiringKeyRepository(time.Hour)
		if err != nil {
			log.Fatal(err)
		}
		d := &wmmiddleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: repo, Timeout: 5 * time.Second}
		return chainCase{handler: d.Middleware(noop), close: func() {}}
	case "memstore":
		s := memstore.New(memstore.Config{})
		return ours(s, false, noop, func() {})
	case "redisstore":
		return ours(newRedisStore(rc, false), false, noop, func() {})
	case "redisstore-nopipeline":
		return ours(newRedisStore(rc, true), false, noop, func() {})
	case "redisstore-nocache":
		return ours(newRedisStore(rc, false), true, noop, func() {})
	case "pgstore":
		return ours(pg.store(), false, noop, pg.purge)
	case "pgstore-tx":
		s := pg.store()
		return ours(s, false, pg.bookingHandler(s), pg.purge)
	case "mysqlstore":
		return ours(my.store(), false, noop, my.purge)
	case "mysqlstore-tx":
		s := my.store()
		return ours(s, false, my.bookingHandler(s), my.purge)
	case "naiveredis":
		return chainCase{handler: benchref.NaiveRedis{Client: rc, Prefix: prefix + ":", TTL: time.Hour}.Middleware(noop), close: func() {}}
	}
	log.Fatalf("unknown chain %q", name)
	return chainCase{}
}

// chainDupKeys is how many completed keys the duplicate load cycles
// through, and warmConcurrency how many goroutines send them through the
// chain before it is measured (unmeasured, so only to be quick).
const (
	chainDupKeys    = 1024
	warmConcurrency = 64
)

// runChain calls each chain from c goroutines for o.chainDur, with fresh
// keys and then with duplicates of chainDupKeys completed keys. Before the
// duplicates are measured, each of those keys goes through the chain once
// more, unmeasured, so that ours meets them with its local cache warm.
func runChain(o options, rc *redis.Client, pg *pgBench, my *mysqlBench) []Rate {
	var out []Rate
	warmPool(rc, 2*maxInt(o.concurrency))
	for i, name := range chainDedups {
		if needsPG[name] && pg == nil || needsMySQL[name] && my == nil {
			continue
		}
		prefix := o.prefix + "-chain" + strconv.Itoa(i)
		cc := buildChain(name, rc, pg, my, prefix)
		call := func(key string) {
			if _, err := cc.handler(message.NewMessage(key, nil)); err != nil {
				log.Fatalf("chain %s: %v", name, err)
			}
		}
		var seq atomic.Uint64
		fresh := func() string { return "f" + strconv.FormatUint(seq.Add(1), 10) }
		dups := make([]string, chainDupKeys)
		for j := range dups {
			dups[j] = fresh()
		}
		forEach(warmConcurrency, dups, call)
		var dseq atomic.Uint64
		dup := func() string { return dups[dseq.Add(1)%uint64(len(dups))] }
		for _, c := range o.concurrency {
			for _, load := range []string{"fresh", "duplicate"} {
				key := fresh
				if load == "duplicate" {
					key = dup
					forEach(warmConcurrency, dups, call)
				}
				var hits0, misses0 uint64
				if cc.idem != nil {
					hits0, misses0 = cacheCounts(cc.idem)
				}
				n, secs := hammer(c, o.chainDur, func() error {
					_, err := cc.handler(message.NewMessage(key(), nil))
					return err
				})
				rt := Rate{Section: "chain", Dedup: name, Load: load, Concurrency: c,
					Messages: n, Seconds: secs, PerSecond: float64(n) / secs}
				if cc.idem != nil {
					hits, misses := cacheCounts(cc.idem)
					rt.CacheHits, rt.CacheMisses = hits-hits0, misses-misses0
				}
				out = append(out, rt)
				o.logf("chain %s %s c=%d: %.0f/s", name, load, c, rt.PerSecond)
			}
		}
		cc.close()
		cleanup(rc, prefix)
	}
	return out
}
