package main

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// floorDedup is the least a deduplication on Redis can send, the end to
// end section's floor: SET key 1 NX PX lease before the handler (a key
// already there: the message is acked as a duplicate, without running the
// handler or replaying any output), SET key done XX PX ttl after it
// succeeds, DEL key after it fails, so that a redelivery runs it again.
// Nothing more: no owner token, no fencing, no lease renewal, no stored
// output, no attempts; a message whose SET XX fails is nacked, and its
// redelivery acked as a duplicate. A reference for the cost of two Redis
// commands per message, never a deduplication to use.
//
// Its commands ride the same go-redis deferred auto-pipeliner as our store
// on the same client (Submit, then WaitContext under the message's
// context), so that beside ours it differs by the commands it sends, not
// by their batching.
type floorDedup struct {
	ap     *redis.AutoPipeliner
	prefix string
	lease  time.Duration
	ttl    time.Duration
}

// newFloorDedup returns the floor on rc, keys under prefix. It creates a
// redisstore on rc first: go-redis keeps one deferred auto-pipeliner per
// client, configured by its first caller, so the floor then shares the one
// the store set up (and would otherwise set it up with go-redis's defaults,
// which the store declines).
func newFloorDedup(rc *redis.Client, prefix string, lease, ttl time.Duration) floorDedup {
	_ = newRedisStore(rc, false)
	ap, err := rc.AsyncAutoPipeline()
	if err != nil {
		log.Fatalf("floor: auto-pipelining: %v", err)
	}
	return floorDedup{ap: ap, prefix: prefix, lease: lease, ttl: ttl}
}

// Middleware deduplicates by the requestId metadata, else the UUID.
func (f floorDedup) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		id := msg.Metadata.Get("requestId")
		if id == "" {
			id = msg.UUID
		}
		key := f.prefix + id
		fresh, err := f.send(ctx, "set", key, "1", "nx", "px", f.lease.Milliseconds())
		if err != nil {
			return nil, err
		}
		if !fresh {
			return nil, nil
		}
		out, err := h(msg)
		if err != nil {
			_, _ = f.send(context.WithoutCancel(ctx), "del", key)
			return nil, err
		}
		if _, err := f.send(ctx, "set", key, "done", "xx", "px", f.ttl.Milliseconds()); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// send runs one command through the auto-pipeliner and reports whether it
// answered something other than nil.
func (f floorDedup) send(ctx context.Context, args ...any) (bool, error) {
	cmd := redis.NewCmd(ctx, args...)
	err := f.ap.Submit(ctx, cmd).WaitContext(ctx)
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}
