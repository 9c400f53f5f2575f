package benchref

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// NaiveRedis is the check-then-set deduplication many services start with:
// GET the message's key, run the handler if it is missing, then SET it. It
// costs two round trips per fresh message, like the idempotency middleware,
// and it is wrong: concurrent copies of a message all see the key missing
// and all run the handler, and a failed handler leaves nothing to retry
// safely. Never use it.
type NaiveRedis struct {
	Client *redis.Client
	// Prefix starts every key; the message UUID follows.
	Prefix string
	// TTL is how long a key is remembered.
	TTL time.Duration
}

// Middleware wraps h with the naive check-then-set.
func (n NaiveRedis) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		key := n.Prefix + msg.UUID
		err := n.Client.Get(ctx, key).Err()
		switch {
		case err == nil:
			return nil, nil // seen: drop
		case !errors.Is(err, redis.Nil):
			return nil, err
		}
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		return out, n.Client.Set(ctx, key, "1", n.TTL).Err()
	}
}
