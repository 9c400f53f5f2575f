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

// NewExpiringKeyRepository returns Watermill's
// [middleware.ExpiringKeyRepository] on Redis, for Watermill's
// [middleware.Deduplicator]: a key is a duplicate when any process saw it
// within window, which must be positive. prefix is prepended to each key.
//
//	repo, _ := redisstore.NewExpiringKeyRepository(client, "dedup:", time.Hour)
//	d := &middleware.Deduplicator{Repository: repo, Timeout: 5 * time.Second}
//
// Set the Deduplicator's Timeout: a zero one becomes 5 ms. The Deduplicator
// marks a key before its handler runs, so a message whose first attempt
// failed is dropped on redelivery; [Store] has no such flaw. Unlike New,
// it takes a client that ignores context deadlines: it holds no lease.
func NewExpiringKeyRepository(client redis.UniversalClient, prefix string, window time.Duration) (middleware.ExpiringKeyRepository, error) {
	if isNil(client) {
		return nil, ErrNilClient
	}
	if window <= 0 {
		return nil, fmt.Errorf("redisstore: repository window %v must be positive", window)
	}
	return &repository{client: client, prefix: prefix, window: window}, nil
}

// repository is NewExpiringKeyRepository's.
type repository struct {
	client redis.UniversalClient
	prefix string
	window time.Duration
}

// IsDuplicate reports whether key was seen within the window, and marks it
// seen otherwise: one SET NX GET PX, atomic across processes. Each call
// writes a value of its own, so that a call whose SET was applied but whose
// reply was lost, and which the client then resent, finds its own value and
// still reports a fresh key: a message is never taken for a duplicate of
// itself. Needs Redis 7.0 or newer (SET with both NX and GET). A full
// Redis (maxmemory) refuses the SET: a key it holds is then still a
// duplicate (one more round trip), and a new key an error.
func (r *repository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	mark := storekit.NewToken()
	old, err := r.client.Do(ctx, "set", r.prefix+key, mark, "nx", "get", "px", millis(r.window)).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil // the key was absent: this call marked it
	case isFull(err):
		// A full Redis refuses the SET whatever the key holds, and wrote
		// nothing: a key seen within the window is still a duplicate.
		n, xerr := r.client.Exists(ctx, r.prefix+key).Result()
		if xerr == nil && n == 1 {
			return true, nil
		}
		return false, callError(ctx, "is-duplicate", key, err)
	case err != nil:
		// The SET may have been applied with its answer lost or given up
		// on: the message is nacked, and its redelivery must not find this
		// call's mark, or it would be dropped as a duplicate of itself.
		r.unmark(ctx, key, mark)
		return false, wrap("is-duplicate", key, err)
	}
	return old != mark, nil
}

// unmarkTimeout bounds the removal of a mark whose SET had no answer; the
// caller's context, which may already be over, does not.
const unmarkTimeout = time.Second

// unmark removes key's mark if it is still the one this call wrote.
func (r *repository) unmark(ctx context.Context, key, mark string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unmarkTimeout)
	defer cancel()
	_ = unmarkScript.Run(ctx, r.client, []string{r.prefix + key}, mark).Err() // a store that is down kept no mark either, or keeps it: nothing more to do
}
