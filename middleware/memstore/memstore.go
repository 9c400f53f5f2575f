package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware"
)

// ErrClosed is returned by every method of a store after Close.
var ErrClosed = errors.New("memstore: closed")

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Now returns the current time. Zero means time.Now. Tests inject a fake
	// clock here to move through leases and TTLs without sleeping.
	Now func() time.Time
}

// Store is an in-memory middleware.Store, safe for concurrent use.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	closed  bool
	records map[string]*entry
	expiry  expiryHeap
}

var _ middleware.InProcessStore = (*Store)(nil)

// InProcess marks the store as one whose calls never wait on I/O, so the
// middleware skips its per-call timeout (middleware.InProcessStore).
func (s *Store) InProcess() {}

type entry struct {
	rec middleware.Record
	key string
	// expireAt is the record's expiry in Unix nanoseconds of the clock.
	expireAt int64
	// queuedAt is the time of this entry's one item in the expiry heap: never
	// after expireAt, so the item comes up no later than the record expires.
	queuedAt int64
}

// New returns an empty store.
func New(cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{now: cfg.Now, records: make(map[string]*entry)}
}

// Close releases the store; later calls return ErrClosed. It starts and
// stops no goroutine: expired records are reclaimed by writes.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.records = nil
	s.expiry = nil
	return nil
}

// Len returns the number of records held, expired ones not yet reclaimed
// included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// Claim implements middleware.Store.
func (s *Store) Claim(ctx context.Context, key string, lease time.Duration, fingerprint []byte) (middleware.ClaimResult, error) {
	if err := middleware.CheckClaim(key, lease); err != nil {
		return middleware.ClaimResult{}, fmt.Errorf("memstore: claim: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return middleware.ClaimResult{}, fmt.Errorf("memstore: claim: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return middleware.ClaimResult{}, ErrClosed
	}
	now := s.now()
	s.reclaim(now)
	e := s.live(key, now)
	if e != nil {
		mismatch := len(fingerprint) > 0 && len(e.rec.Fingerprint) > 0 && !bytes.Equal(fingerprint, e.rec.Fingerprint)
		if mismatch || e.rec.State != middleware.StateFailed {
			rec := cloneRecord(e.rec)
			rec.Token = "" // only the owner learns its token
			return middleware.ClaimResult{Record: rec}, nil
		}
	}
	// Only a claim that acquires needs a token: duplicates, the common case
	// under redelivery, skip the random read.
	token, err := newToken()
	if err != nil {
		return middleware.ClaimResult{}, err
	}
	rec := middleware.Record{State: middleware.StateInProgress, Token: token, Attempts: 1, CreatedAt: now, UpdatedAt: now,
		Fingerprint: bytes.Clone(fingerprint)}
	if e != nil { // FAILED: a new attempt of the same record
		rec.Attempts = e.rec.Attempts + 1
		rec.CreatedAt = e.rec.CreatedAt
		if len(rec.Fingerprint) == 0 {
			rec.Fingerprint = e.rec.Fingerprint
		}
	}
	s.put(key, rec, now.Add(lease))
	return middleware.ClaimResult{Acquired: true, Token: token, Record: cloneRecord(rec)}, nil
}

// Renew implements middleware.Store.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	return s.transition(ctx, "renew", key, token, lease, func(r *middleware.Record) {})
}

// Complete implements middleware.Store.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.transition(ctx, "complete", key, token, ttl, func(r *middleware.Record) {
		r.State = middleware.StateCompleted
		r.Token = ""
		r.Result = append([]byte{}, result...)
	})
}

// Fail implements middleware.Store.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.transition(ctx, "fail", key, token, ttl, func(r *middleware.Record) {
		r.State = middleware.StateFailed
		r.Token = ""
	})
}

// transition applies change to the record of key if token owns it, and sets
// its expiry to ttl from now.
func (s *Store) transition(ctx context.Context, op, key, token string, ttl time.Duration, change func(*middleware.Record)) error {
	if err := middleware.CheckOwner(key, token, ttl); err != nil {
		return fmt.Errorf("memstore: %s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %s: %w", op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	now := s.now()
	s.reclaim(now)
	e := s.live(key, now)
	if e == nil || e.rec.State != middleware.StateInProgress || e.rec.Token != token {
		return fmt.Errorf("memstore: %s: %w", op, middleware.ErrLeaseLost)
	}
	rec := e.rec
	change(&rec)
	if op != "renew" {
		rec.UpdatedAt = now
	}
	s.put(key, rec, now.Add(ttl))
	return nil
}

// Get implements middleware.Store.
func (s *Store) Get(ctx context.Context, key string) (middleware.Record, error) {
	if key == "" {
		return middleware.Record{}, fmt.Errorf("memstore: get: %w", middleware.ErrEmptyKey)
	}
	if err := ctx.Err(); err != nil {
		return middleware.Record{}, fmt.Errorf("memstore: get: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return middleware.Record{}, ErrClosed
	}
	if e := s.live(key, s.now()); e != nil {
		return cloneRecord(e.rec), nil
	}
	return middleware.Record{State: middleware.StateAbsent}, nil
}

// Delete implements middleware.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("memstore: delete: %w", middleware.ErrEmptyKey)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: delete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	delete(s.records, key) // its heap item is dropped when it comes up
	return nil
}

// live returns key's entry unless it is missing or expired; an expired one is
// removed on the spot. The caller holds s.mu.
func (s *Store) live(key string, now time.Time) *entry {
	e, ok := s.records[key]
	if !ok {
		return nil
	}
	if now.UnixNano() >= e.expireAt {
		delete(s.records, key)
		return nil
	}
	return e
}

// put stores rec under key until expireAt. The caller holds s.mu.
//
// Each entry has one item in the expiry heap. Extending the expiry (renewal,
// completion with a longer TTL) leaves the item where it is: when it comes
// up, reclaim finds the entry still live and queues it again at its new
// expiry. Only an expiry earlier than the queued one adds an item, so most
// keys cost one heap push in their lifetime.
func (s *Store) put(key string, rec middleware.Record, expiry time.Time) {
	expireAt := expiry.UnixNano()
	e, ok := s.records[key]
	if !ok {
		e = &entry{key: key}
		s.records[key] = e
	}
	e.rec = rec
	e.expireAt = expireAt
	if !ok || expireAt < e.queuedAt {
		e.queuedAt = expireAt
		s.expiry.push(expiryItem{at: expireAt, entry: e})
	}
}

// reclaim removes every record whose expiry has passed. The caller holds s.mu.
func (s *Store) reclaim(now time.Time) {
	nanos := now.UnixNano()
	for len(s.expiry) > 0 && nanos >= s.expiry[0].at {
		it := s.expiry.pop()
		e := it.entry
		if s.records[e.key] != e || it.at != e.queuedAt {
			continue // deleted, replaced, or queued again earlier
		}
		if nanos < e.expireAt {
			e.queuedAt = e.expireAt
			s.expiry.push(expiryItem{at: e.expireAt, entry: e})
			continue
		}
		delete(s.records, e.key)
	}
}

func cloneRecord(r middleware.Record) middleware.Record {
	r.Result = cloneKeepEmpty(r.Result)
	r.Fingerprint = bytes.Clone(r.Fingerprint)
	return r
}

// cloneKeepEmpty copies b, keeping the difference between nil and empty.
func cloneKeepEmpty(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("memstore: owner token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

type expiryItem struct {
	at    int64 // Unix nanoseconds
	entry *entry
}

// expiryHeap is a min-heap of items by time, typed to avoid boxing each
// item as container/heap would.
type expiryHeap []expiryItem

func (h *expiryHeap) push(it expiryItem) {
	*h = append(*h, it)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if q[i].at >= q[parent].at {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (h *expiryHeap) pop() expiryItem {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = expiryItem{}
	q = q[:last]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(q) && q[l].at < q[least].at {
			least = l
		}
		if r < len(q) && q[r].at < q[least].at {
			least = r
		}
		if least == i {
			break
		}
		q[i], q[least] = q[least], q[i]
		i = least
	}
	*h = q
	return top
}
