package redisstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// The store alone on the shared Redis (REDIS_ADDR; fails when it is down,
// skipped under -short), without the middleware: one fresh message is Claim then
// Complete; one duplicate is a Claim of a completed key.
//
//	go test -run '^$' -bench . -benchmem ./middleware/redisstore/
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testserver.RedisAddr(b), PoolSize: 128})
	b.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client)
	if err != nil {
		b.Fatal(err)
	}
	prefix := "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	b.Cleanup(func() { unlinkPrefix(client, prefix) })
	var seq atomic.Uint64
	fresh := func(b *testing.B) {
		key := prefix + "f" + strconv.FormatUint(seq.Add(1), 10)
		res, err := s.Claim(ctx, key, time.Minute, nil)
		if err != nil || !res.Acquired {
			b.Fatalf("claim %s: %v %+v", key, err, res)
		}
		if err := s.Complete(ctx, key, res.Token, nil, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	dups := make([]string, 1024)
	for i := range dups {
		dups[i] = prefix + "d" + strconv.Itoa(i)
		res, err := s.Claim(ctx, dups[i], time.Minute, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, dups[i], res.Token, nil, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	var dseq atomic.Uint64
	duplicate := func(b *testing.B) {
		res, err := s.Claim(ctx, dups[dseq.Add(1)%1024], time.Minute, nil)
		if err != nil || res.Acquired {
			b.Fatalf("duplicate claim: %v %+v", err, res)
		}
	}
	for _, load := range []struct {
		name string
		op   func(*testing.B)
	}{{"fresh", fresh}, {"duplicate", duplicate}} {
		b.Run(load.name+"/seq", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				load.op(b)
			}
		})
		b.Run(load.name+"/c64", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					load.op(b)
				}
			})
		})
	}
}

// unlinkPrefix removes the benchmark's keys; it never flushes.
func unlinkPrefix(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}
