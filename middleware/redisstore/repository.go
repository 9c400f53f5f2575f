package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ExpiringKeyRepository is Watermill's middleware.ExpiringKeyRepository on
// Redis: a key is a duplicate when it was seen within the window, by any
// process sharing the Redis. Plug it into Watermill's Deduplicator:
//
//	repo, _ := redisstore.NewExpiringKeyRepository(client, "dedup:", time.Hour)
//	d := &middleware.Deduplicator{Repository: repo}
//
// Watermill's Deduplicator marks a key before the handler runs, so a message
// whose first attempt failed is dropped on redelivery; the idempotency
// middleware of this module does not have that flaw and is the better choice
// for new code.
type ExpiringKeyRepository struct {
	client redis.UniversalClient
	prefix string
	window time.Duration
}

// NewExpiringKeyRepository returns a repository that stores each key, with
// prefix prepended, for window. window must be positive.
func NewExpiringKeyRepository(client redis.UniversalClient, prefix string, window time.Duration) (*ExpiringKeyRepository, error) {
	if isNil(client) {
		return nil, ErrNilClient
	}
	if window <= 0 {
		return nil, fmt.Errorf("redisstore: repository window %v must be positive", window)
	}
	return &ExpiringKeyRepository{client: client, prefix: prefix, window: window}, nil
}

// IsDuplicate reports whether key was seen within the window, and marks it
// seen otherwise: one SET NX PX, atomic across processes.
func (r *ExpiringKeyRepository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	err := r.client.SetArgs(ctx, r.prefix+key, "1", redis.SetArgs{Mode: "NX", TTL: r.window}).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return true, nil
	case err != nil:
		return false, wrap("is-duplicate", key, err)
	}
	return false, nil
}
