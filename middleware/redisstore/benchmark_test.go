package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// The store alone on the shared Redis (REDIS_ADDR; fails when it is down,
// skipped under -short), without the middleware (storetest.Benchmark).
//
//	go test -run '^$' -bench . -benchmem ./middleware/redisstore/
func BenchmarkStore(b *testing.B) {
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: testserver.RedisAddr(b), PoolSize: 128})
	b.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	if err != nil {
		b.Fatal(err)
	}
	prefix := "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	b.Cleanup(func() { unlinkPrefix(client, prefix) })
	storetest.Benchmark(b, s, prefix)
}

// unlinkPrefix removes every key under prefix, as well as it can: tests
// never flush the shared server.
func unlinkPrefix(c *redis.Client, prefix string) {
	_ = rediskeys.Delete(context.Background(), c, prefix+"*")
}
