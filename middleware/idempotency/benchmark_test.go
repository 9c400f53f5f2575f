package idempotency_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/benchref"
	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The chain benchmarks measure what one message costs in the middleware
// chain alone, the handler doing nothing, for:
//
//	none       the handler, no deduplication (the floor)
//	watermill  Watermill's Deduplicator with its in-memory repository, keyed
//	           by the message UUID like ours (not by its default Adler-32 of
//	           the payload), so both derive the same key
//	memstore   ours on memstore
//	redisstore ours on the shared Redis (REDIS_ADDR, default 127.0.0.1:6379)
//	naiveredis a reference only: GET the key, run the handler, SET the key.
//	           Two commands per fresh message like ours, but two consumers
//	           that GET at once both run the handler: the race our claim
//	           script exists to close. Never use it.
//
// each with fresh keys (every message new) and duplicates (every key already
// completed), sequentially and with 64 goroutines (b.SetParallelism, so 64
// whatever GOMAXPROCS is). Redis-backed cases fail when Redis does not answer
// and are skipped under -short; they report the Redis commands sent per
// message (redis-cmds/op): a duplicate of a key this process completed is
// answered by the cache of completed keys, without a command.
//
//	go test -run '^$' -bench Chain -benchmem ./middleware/

const benchConcurrency = 64

func noopHandler(*message.Message) ([]*message.Message, error) { return nil, nil }

// chainCase builds the middleware under test; prefix isolates its keys.
type chainCase struct {
	name  string
	redis bool
	build func(b *testing.B, client *redis.Client, prefix string) message.HandlerMiddleware
}

var chainCases = []chainCase{
	{name: "none", build: func(*testing.B, *redis.Client, string) message.HandlerMiddleware {
		return func(h message.HandlerFunc) message.HandlerFunc { return h }
	}},
	{name: "watermill", build: func(b *testing.B, _ *redis.Client, _ string) message.HandlerMiddleware {
		repo, err := wmmiddleware.NewMapExpiringKeyRepository(time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		d := &wmmiddleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: repo,
			Timeout:    5 * time.Second,
		}
		return d.Middleware
	}},
	{name: "memstore", build: func(b *testing.B, _ *redis.Client, prefix string) message.HandlerMiddleware {
		store := memstore.New(memstore.Config{})
		return benchIdem(b, store, prefix).Middleware
	}},
	{name: "redisstore", redis: true, build: func(b *testing.B, client *redis.Client, prefix string) message.HandlerMiddleware {
		store, err := redisstore.New(client)
		if err != nil {
			b.Fatal(err)
		}
		return benchIdem(b, store, prefix).Middleware
	}},
	{name: "naiveredis", redis: true, build: func(_ *testing.B, client *redis.Client, prefix string) message.HandlerMiddleware {
		return benchref.NaiveRedis{Client: client, Prefix: prefix + ":", TTL: time.Hour}.Middleware
	}},
}

func benchIdem(b *testing.B, store idempotency.Store, prefix string) *idempotency.Middleware {
	idem, err := newMiddleware(testConfig{Store: store, KeyPrefix: prefix, CompletedTTL: time.Hour}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return idem
}

// benchRedis returns a client of the shared Redis with a pool large enough
// for 64 goroutines; it fails the benchmark when Redis is down, and skips it
// under -short.
func benchRedis(b *testing.B) *redis.Client {
	b.Helper()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: testserver.RedisAddr(b), PoolSize: 2 * benchConcurrency})
	b.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		b.Fatalf("Redis at %s: %v", c.Options().Addr, err)
	}
	return c
}

// unlinkPrefix removes every key under prefix; benchmarks never flush.
func unlinkPrefix(b *testing.B, c *redis.Client, prefix string) {
	if err := rediskeys.Delete(context.Background(), c, prefix+"*"); err != nil {
		b.Logf("clean up: %v", err)
	}
}

func BenchmarkChain(b *testing.B) {
	for _, cc := range chainCases {
		b.Run(cc.name, func(b *testing.B) {
			var client *redis.Client
			commands := &commandCounter{}
			prefix := "bench-" + watermill.NewShortUUID()
			if cc.redis {
				client = benchRedis(b)
				b.Cleanup(func() { unlinkPrefix(b, client, prefix) })
				client.AddHook(commands)
			}
			reportCommands := func(b *testing.B, before int64) {
				if cc.redis {
					b.ReportMetric(float64(commands.n.Load()-before)/float64(b.N), "redis-cmds/op")
				}
			}
			chain := cc.build(b, client, prefix)(noopHandler)

			var seq atomic.Uint64
			fresh := func() string { return "fresh-" + strconv.FormatUint(seq.Add(1), 10) }

			// 1024 keys run once, so that every later copy is a duplicate.
			const dupKeys = 1024
			dups := make([]string, dupKeys)
			for i := range dups {
				dups[i] = fresh()
				if _, err := chain(message.NewMessage(dups[i], nil)); err != nil {
					b.Fatal(err)
				}
			}
			var dupSeq atomic.Uint64
			duplicate := func() string { return dups[dupSeq.Add(1)%dupKeys] }

			for _, load := range []struct {
				name string
				key  func() string
			}{{"fresh", fresh}, {"duplicate", duplicate}} {
				b.Run(load.name+"/seq", func(b *testing.B) {
					b.ReportAllocs()
					before := commands.n.Load()
					for b.Loop() {
						if _, err := chain(message.NewMessage(load.key(), nil)); err != nil {
							b.Fatal(err)
						}
					}
					reportCommands(b, before)
				})
				b.Run(load.name+"/c64", func(b *testing.B) {
					b.ReportAllocs()
					b.SetParallelism((benchConcurrency + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
					before := commands.n.Load()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, err := chain(message.NewMessage(load.key(), nil)); err != nil {
								b.Error(err)
								return
							}
						}
					})
					reportCommands(b, before)
				})
			}
		})
	}
}
