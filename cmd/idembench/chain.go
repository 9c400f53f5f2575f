package main

import (
	"context"
	"log"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/benchref"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
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
	Note        string  `json:"note,omitempty"`
}

func noop(*message.Message) ([]*message.Message, error) { return nil, nil }

// chainDedups names the middlewares of the chain section, in table order.
// pgstore-tx is ours on PostgreSQL with a handler that books a row and
// completes in its own transaction (BEGIN, INSERT, CompleteInTx, COMMIT):
// it does work the others' handlers do not.
var chainDedups = []string{"none", "watermill", "memstore", "redisstore", "pgstore", "pgstore-tx", "naiveredis"}

// needsPG says which chains run on PostgreSQL, left out without -pg.
var needsPG = map[string]bool{"pgstore": true, "pgstore-tx": true}

func buildChain(name string, rc *redis.Client, pg *pgBench, prefix string) (message.HandlerFunc, func()) {
	switch name {
	case "none":
		return noop, func() {}
	case "watermill":
		repo, err := wmmiddleware.NewMapExpiringKeyRepository(time.Hour)
		if err != nil {
			log.Fatal(err)
		}
		d := &wmmiddleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: repo, Timeout: 5 * time.Second}
		return d.Middleware(noop), func() {}
	case "memstore":
		s := memstore.New(memstore.Config{})
		return newIdem(s, prefix).Middleware(noop), func() { _ = s.Close() }
	case "redisstore":
		s, err := redisstore.New(rc)
		if err != nil {
			log.Fatal(err)
		}
		return newIdem(s, prefix).Middleware(noop), func() {}
	case "pgstore":
		return newIdem(pg.store(), prefix).Middleware(noop), pg.purge
	case "pgstore-tx":
		s := pg.store()
		return newIdem(s, prefix).Middleware(pg.bookingHandler(s)), pg.purge
	case "naiveredis":
		return benchref.NaiveRedis{Client: rc, Prefix: prefix + ":", TTL: time.Hour}.Middleware(noop), func() {}
	}
	log.Fatalf("unknown chain %q", name)
	return nil, nil
}

func newIdem(s idempotency.Store, prefix string) *idempotency.Idempotency {
	idem, err := idempotency.New(idempotency.Config{Store: s, KeyPrefix: prefix, CompletedTTL: time.Hour}, nil)
	if err != nil {
		log.Fatal(err)
	}
	return idem
}

// runChain calls each chain from c goroutines for o.chainDur, with fresh
// keys and then with duplicates of 1024 completed keys.
func runChain(o options, rc *redis.Client, pg *pgBench) []Rate {
	var out []Rate
	warmPool(rc, 2*maxInt(o.concurrency))
	for i, name := range chainDedups {
		if needsPG[name] && pg == nil {
			continue
		}
		prefix := o.prefix + ":chain" + strconv.Itoa(i)
		chain, closeFn := buildChain(name, rc, pg, prefix)
		var seq atomic.Uint64
		fresh := func() string { return "f" + strconv.FormatUint(seq.Add(1), 10) }
		dups := make([]string, 1024)
		for j := range dups {
			dups[j] = fresh()
			if _, err := chain(message.NewMessage(dups[j], nil)); err != nil {
				log.Fatalf("chain %s: %v", name, err)
			}
		}
		var dseq atomic.Uint64
		dup := func() string { return dups[dseq.Add(1)%uint64(len(dups))] }
		for _, c := range o.concurrency {
			for _, load := range []string{"fresh", "duplicate"} {
				key := fresh
				if load == "duplicate" {
					key = dup
				}
				n, secs := hammer(c, o.chainDur, func() error {
					_, err := chain(message.NewMessage(key(), nil))
					return err
				})
				out = append(out, Rate{Section: "chain", Dedup: name, Load: load, Concurrency: c,
					Messages: n, Seconds: secs, PerSecond: float64(n) / secs})
				o.logf("chain %s %s c=%d: %.0f/s", name, load, c, float64(n)/secs)
			}
		}
		closeFn()
		cleanup(rc, prefix)
	}
	return out
}

// hammer calls f from c goroutines until d has passed, and returns the
// number of successful calls and the seconds they took.
func hammer(c int, d time.Duration, f func() error) (int64, float64) {
	var n atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range c {
		wg.Go(func() {
			for i := 0; ; i++ {
				if i%16 == 0 && time.Now().After(deadline) {
					return
				}
				if err := f(); err != nil {
					if !failed.Swap(true) {
						log.Printf("error under load: %v", err)
					}
					continue
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return n.Load(), time.Since(start).Seconds()
}

// warmPool opens n connections so that no measurement pays for dialling.
func warmPool(rc *redis.Client, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _ = rc.Ping(context.Background()).Err() })
	}
	wg.Wait()
}

func maxInt(xs []int) int {
	m := 1
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// cleanup unlinks every key under prefix.
func cleanup(rc *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rc.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			rc.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rc.Unlink(ctx, batch...)
	}
	if err := iter.Err(); err != nil {
		log.Printf("clean up %s*: %v", prefix, err)
	}
}
