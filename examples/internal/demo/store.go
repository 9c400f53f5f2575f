package demo

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// OpenStore returns the Redis store at redisURL (redis://host:port/db), or,
// when redisURL is empty, an in-memory store: one process only, fine for a
// demo, never for production. closeStore releases what the store holds.
func OpenStore(redisURL string) (store idempotency.Store, closeStore func(), err error) {
	if redisURL == "" {
		s := memstore.New(memstore.Config{})
		return s, func() { _ = s.Close() }, nil
	}
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	opts.ContextTimeoutEnabled = true // store calls must honour their deadlines (redisstore.New requires it)
	client := redis.NewClient(opts)
	s, err := redisstore.New(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return s, func() { _ = client.Close() }, nil
}
