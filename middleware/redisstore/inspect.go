package redisstore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Records and DeleteIf are what an operator's tool (cmd/idemctl) needs.
// Neither is on the path of a message.

// scanCount is the COUNT hint of Records' SCAN calls.
const scanCount = 1000

// Records yields every key that starts with prefix (every key when it is
// empty), by SCAN, with its record, TTL and MEMORY USAGE. On a Cluster it
// walks every master, on a ring every shard. Like SCAN it may yield a key
// twice and miss one made or deleted meanwhile. Each key costs one Get and
// one pipeline of PTTL and MEMORY USAGE. The iterator's error ends the walk; a corrupt record is its
// Entry's Err, wrapping [idempotency.ErrCorruptRecord], and the walk goes on.
func (s *Store) Records(ctx context.Context, prefix string) iter.Seq2[idempotency.Entry, error] {
	return func(yield func(idempotency.Entry, error) bool) {
		for key, err := range s.scan(ctx, prefix) {
			if err != nil {
				yield(idempotency.Entry{}, err)
				return
			}
			e := idempotency.Entry{Key: key}
			e.Record, e.Err = s.Get(ctx, key)
			if e.Err == nil && e.Record.State != idempotency.StateAbsent {
				e.TTL, e.Bytes, e.Err = s.ttlAndBytes(ctx, key)
			}
			if e.Err != nil && ctx.Err() != nil {
				yield(idempotency.Entry{}, e.Err)
				return
			}
			if !yield(e, nil) {
				return
			}
		}
	}
}

// ttlAndBytes reads key's PTTL and MEMORY USAGE in one pipeline: zero
// for a key without expiry, or gone.
func (s *Store) ttlAndBytes(ctx context.Context, key string) (time.Duration, int64, error) {
	pipe := s.client.Pipeline()
	ttl := pipe.PTTL(ctx, key)
	mem := pipe.MemoryUsage(ctx, key, 0)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, callError(ctx, "records", key, err)
	}
	return max(ttl.Val(), 0), mem.Val(), nil
}

// DeleteIf deletes key, in one script, only when its record is in one of
// states, and reports the state it found (StateAbsent for no key). A live
// lease is StateInProgress; a lapsed one is StateFailed. An owner whose
// record was deleted gets [idempotency.ErrLeaseLost] next. A corrupt value
// is [idempotency.ErrCorruptRecord] and stays: Delete removes it.
func (s *Store) DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error) {
	if key == "" {
		return 0, false, wrap("delete if", key, idempotency.ErrEmptyKey)
	}
	var letters strings.Builder
	for _, st := range states {
		switch st {
		case idempotency.StateInProgress:
			letters.WriteByte('P')
		case idempotency.StateFailed:
			letters.WriteByte('F')
		case idempotency.StateCompleted:
			letters.WriteByte('C')
		default:
			return 0, false, wrap("delete if", key, fmt.Errorf("cannot select records in state %s", st))
		}
	}
	v, err := deleteIfScript.Run(ctx, s.client, []string{key}, letters.String()).Slice()
	if err != nil {
		return 0, false, scriptError(ctx, "delete if", key, err)
	}
	if len(v) != 2 {
		return 0, false, wrap("delete if", key, malformed(fmt.Sprintf("reply of %d fields", len(v))))
	}
	n, ok1 := v[0].(int64)
	letter, ok2 := v[1].(string)
	found, ok3 := map[string]idempotency.State{"A": idempotency.StateAbsent, "P": idempotency.StateInProgress,
		"F": idempotency.StateFailed, "C": idempotency.StateCompleted}[letter]
	if !ok1 || !ok2 || !ok3 || (n != 0 && n != 1) {
		return 0, false, wrap("delete if", key, malformed(fmt.Sprintf("delete reply %#v", v)))
	}
	return found, n == 1, nil
}

// scan yields the keys under prefix, from every master of a Cluster or
// shard of a ring.
func (s *Store) scan(ctx context.Context, prefix string) iter.Seq2[string, error] {
	match := globEscape(prefix) + "*"
	return func(yield func(string, error) bool) {
		nodes := []redis.UniversalClient{s.client}
		var each func(context.Context, func(context.Context, *redis.Client) error) error
		switch c := s.client.(type) {
		case *redis.ClusterClient:
			each = c.ForEachMaster
		case *redis.Ring:
			each = c.ForEachShard
		}
		if each != nil {
			var mu sync.Mutex
			nodes = nodes[:0]
			err := each(ctx, func(_ context.Context, c *redis.Client) error {
				mu.Lock()
				defer mu.Unlock()
				nodes = append(nodes, c)
				return nil
			})
			if err != nil {
				yield("", callError(ctx, "scan", prefix, err))
				return
			}
		}
		for _, node := range nodes {
			var cursor uint64
			for {
				keys, next, err := node.Scan(ctx, cursor, match, scanCount).Result()
				if err != nil {
					yield("", callError(ctx, "scan", prefix, err))
					return
				}
				for _, k := range keys {
					if !yield(k, nil) {
						return
					}
				}
				if next == 0 {
					break
				}
				cursor = next
			}
		}
	}
}

// globEscape quotes the characters that SCAN's MATCH pattern gives a
// meaning. It works on bytes: a key need not be UTF-8.
func globEscape(s string) string {
	var b strings.Builder
	for i := range len(s) {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
