package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// This file is what an operator's tool (cmd/idemctl) needs: reading many
// records, their expiry and their memory, and deleting a key only in the
// states the operator named. None of it is on the path of a message.

//go:embed deleteif.lua
var deleteIfLua string

var deleteIfScript = redis.NewScript(prelude + deleteIfLua)

// DefaultScanCount is the COUNT hint of Records' SCAN calls when its batch is
// zero.
const DefaultScanCount = 1000

// Entry is one key found by Records.
type Entry struct {
	// Key is the Redis key.
	Key string
	// Record is the key's record, read by Get; StateAbsent when the key
	// expired between the SCAN that found it and the read.
	Record idempotency.Record
	// TTL is how long the key has left (PTTL), zero when it has none or is
	// gone.
	TTL time.Duration
	// Err is the error reading this key, ErrCorruptRecord for a value that
	// is not a record of the store's; the walk goes on after it.
	Err error
}

// Records walks the keys that start with prefix (every key when it is
// empty) with SCAN, batch keys per call as its COUNT hint (zero means
// DefaultScanCount), and yields each with its record and TTL. On a Cluster
// client it walks every master in turn. Like SCAN it may yield a key twice,
// and a key created or deleted during the walk may be missed; it never
// blocks the server for long. Reading a record costs one Get (EVALSHA) and
// one PTTL per key. The iterator's error is a failed SCAN (the walk then
// ends); an error reading one key is its Entry.Err.
func (s *Store) Records(ctx context.Context, prefix string, batch int) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		for key, err := range s.scan(ctx, prefix, batch) {
			if err != nil {
				yield(Entry{}, err)
				return
			}
			e := Entry{Key: key}
			e.Record, e.Err = s.Get(ctx, key)
			if e.Err == nil && e.Record.State != idempotency.StateAbsent {
				e.TTL, e.Err = s.ttl(ctx, key)
			}
			if e.Err != nil && ctx.Err() != nil {
				yield(Entry{}, e.Err)
				return
			}
			if !yield(e, nil) {
				return
			}
		}
	}
}

// Inspect returns key's record, how long the key has left (zero when it has
// no expiry or is absent) and the bytes Redis spends on it (MEMORY USAGE,
// key and value with the allocator's overhead; zero when absent).
func (s *Store) Inspect(ctx context.Context, key string) (rec idempotency.Record, ttl time.Duration, bytes int64, err error) {
	if rec, err = s.Get(ctx, key); err != nil || rec.State == idempotency.StateAbsent {
		return rec, 0, 0, err
	}
	if ttl, err = s.ttl(ctx, key); err != nil {
		return rec, 0, 0, err
	}
	bytes, err = s.MemoryUsage(ctx, key)
	return rec, ttl, bytes, err
}

// MemoryUsage returns the bytes Redis spends on key (MEMORY USAGE … SAMPLES
// 0: key, value and allocator overhead), whatever its value, or zero when
// the key is absent.
func (s *Store) MemoryUsage(ctx context.Context, key string) (int64, error) {
	if key == "" {
		return 0, wrap("memory usage", key, idempotency.ErrEmptyKey)
	}
	n, err := s.client.MemoryUsage(ctx, key, 0).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, callError(ctx, "memory usage", key, err)
	}
	return n, nil
}

func (s *Store) ttl(ctx context.Context, key string) (time.Duration, error) {
	d, err := s.client.PTTL(ctx, key).Result()
	if err != nil {
		return 0, callError(ctx, "pttl", key, err)
	}
	if d < 0 { // -1 no expiry, -2 gone
		return 0, nil
	}
	return d, nil
}

// DeleteIf deletes key, in one atomic script, only when its record is in
// one of states (StateInProgress meaning a live lease; a lapsed lease is
// StateFailed), and reports the state it found: StateAbsent for a key it
// does not hold. An owner whose record was deleted gets ErrLeaseLost from
// its next renewal, Complete or Fail, and its work's context is cancelled.
// A value that is not a record is ErrCorruptRecord and is not deleted (use
// Delete for it).
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

// scan yields the keys under prefix, from every master of a Cluster.
func (s *Store) scan(ctx context.Context, prefix string, batch int) iter.Seq2[string, error] {
	if batch <= 0 {
		batch = DefaultScanCount
	}
	match := globEscape(prefix) + "*"
	return func(yield func(string, error) bool) {
		nodes := []redis.UniversalClient{s.client}
		if cc, ok := s.client.(*redis.ClusterClient); ok {
			var mu sync.Mutex
			nodes = nodes[:0]
			err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
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
				keys, next, err := node.Scan(ctx, cursor, match, int64(batch)).Result()
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
// meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
