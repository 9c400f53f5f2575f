package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// NewExpiringKeyRepository returns a [middleware.ExpiringKeyRepository]
// for the [middleware.Deduplicator]: a key is a duplicate when any process
// saw it within window (positive). prefix is prepended to each key.
//
//	repo, _ := redisstore.NewExpiringKeyRepository(client, "dedup:", time.Hour)
//	d := &middleware.Deduplicator{Repository: repo, Timeout: 5 * time.Second}
//
// Set the Timeout: a zero one becomes 5 ms. The Deduplicator drops the
// redelivery of a failed first attempt; [Store] does not.
func NewExpiringKeyRepository(client redis.UniversalClient, prefix string, window time.Duration) (middleware.ExpiringKeyRepository, error) {
	if isNil(client) {
		return nil, ErrNilClient
	}
	if window <= 0 {
		return nil, fmt.Errorf("redisstore: repository window %v must be positive", window)
	}
	return &repository{client: client, prefix: prefix, window: window}, nil
}

type repository struct {
	client redis.UniversalClient
	prefix string
	window time.Duration
}

// IsDuplicate reports whether key was seen within the window, and marks it
// otherwise with a value of its own: a resent SET is not its own duplicate.
func (r *repository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	mark := storekit.NewToken()
	old, err := r.client.Do(ctx, "set", r.prefix+key, mark, "nx", "get", "px", millis(r.window)).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil // the key was absent: this call marked it
	case isFull(err):
		// A full Redis wrote nothing: a key seen within the window is still a duplicate.
		n, xerr := r.client.Exists(ctx, r.prefix+key).Result()
		if xerr == nil && n == 1 {
			return true, nil
		}
		return false, callError(ctx, "is-duplicate", key, err)
	case err != nil:
		// The SET may have been applied: remove the mark for the redelivery.
		r.unmark(ctx, key, mark)
		return false, wrap("is-duplicate", key, err)
	}
	return old != mark, nil
}

// unmarkTimeout bounds unmark; the caller's context may already be over.
const unmarkTimeout = time.Second

func (r *repository) unmark(ctx context.Context, key, mark string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unmarkTimeout)
	defer cancel()
	_ = unmarkScript.Run(ctx, r.client, []string{r.prefix + key}, mark).Err() // a store that is down kept no mark either, or keeps it: nothing more to do
}
