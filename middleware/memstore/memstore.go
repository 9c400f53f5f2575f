package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
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
	// salt makes owner tokens unpredictable across stores; seq makes them
	// unique within one.
	salt [8]byte

	mu      sync.Mutex
	seq     uint64
	closed  bool
	records map[string]*entry
	expiry  expiryHeap
}

var _ middleware.InProcessStore = (*Store)(nil)

// InProcess marks the store as one whose calls never wait on I/O, so the
// middleware skips its per-call timeout (middleware.InProcessStore).
func (s *Store) InProcess() {}

// entry is one record, kept compact (times as Unix nanoseconds of the clock,
// few pointers): a busy store holds millions of them and the garbage
// collector scans them all.
type entry struct {
	key         string
	token       string // the owner's, while IN_PROGRESS
	result      []byte // non-nil once COMPLETED
	fingerprint []byte
	created     int64
	updated     int64
	// expireAt is the record's expiry.
	expireAt int64
	// queuedAt is the time of this entry's one item in the expiry heap: never
	// after expireAt, so the item comes up no later than the record expires.
	queuedAt int64
	attempts int32
	state    middleware.State
}

// record returns a copy of the entry as a Record; the token only for its
// owner.
func (e *entry) record(withToken bool) middleware.Record {
	rec := middleware.Record{
		State:       e.state,
		Attempts:    int(e.attempts),
		Result:      cloneKeepEmpty(e.result),
		Fingerprint: bytes.Clone(e.fingerprint),
		CreatedAt:   time.Unix(0, e.created),
		UpdatedAt:   time.Unix(0, e.updated),
	}
	if withToken {
		rec.Token = e.token
	}
	return rec
}

// New returns an empty store.
func New(cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{now: cfg.Now, records: make(map[string]*entry)}
	_, _ = rand.Read(s.salt[:]) // never fails (crypto/rand); a zero salt would still give unique tokens
	return s
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
	now := s.now().UnixNano()
	s.reclaim(now)
	e := s.live(key, now)
	if e != nil {
		mismatch := len(fingerprint) > 0 && len(e.fingerprint) > 0 && !bytes.Equal(fingerprint, e.fingerprint)
		if mismatch || e.state != middleware.StateFailed {
			return middleware.ClaimResult{Record: e.record(false)}, nil
		}
		// FAILED: a new attempt of the same record.
		e.attempts++
		if len(fingerprint) > 0 {
			e.fingerprint = bytes.Clone(fingerprint)
		}
	} else {
		e = &entry{key: key, created: now, attempts: 1, fingerprint: bytes.Clone(fingerprint)}
		s.records[key] = e
	}
	e.state = middleware.StateInProgress
	e.token = s.newToken()
	e.updated = now
	s.expire(e, now+int64(lease))
	return middleware.ClaimResult{Acquired: true, Token: e.token, Record: e.record(true)}, nil
}

// Renew implements middleware.Store.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	return s.transition(ctx, opRenew, key, token, lease, nil)
}

// Complete implements middleware.Store.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.transition(ctx, opComplete, key, token, ttl, result)
}

// Fail implements middleware.Store.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.transition(ctx, opFail, key, token, ttl, nil)
}

type op uint8

const (
	opRenew op = iota
	opComplete
	opFail
)

var opNames = [...]string{opRenew: "renew", opComplete: "complete", opFail: "fail"}

// transition applies o to the record of key if token owns it, and sets its
// expiry to ttl from now.
func (s *Store) transition(ctx context.Context, o op, key, token string, ttl time.Duration, result []byte) error {
	if err := middleware.CheckOwner(key, token, ttl); err != nil {
		return fmt.Errorf("memstore: %s: %w", opNames[o], err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %s: %w", opNames[o], err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	now := s.now().UnixNano()
	s.reclaim(now)
	e := s.live(key, now)
	if e == nil || e.state != middleware.StateInProgress || e.token != token {
		return fmt.Errorf("memstore: %s: %w", opNames[o], middleware.ErrLeaseLost)
	}
	switch o {
	case opComplete:
		e.state = middleware.StateCompleted
		e.token = ""
		e.result = append(make([]byte, 0, len(result)), result...)
		e.updated = now
	case opFail:
		e.state = middleware.StateFailed
		e.token = ""
		e.updated = now
	}
	s.expire(e, now+int64(ttl))
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
	if e := s.live(key, s.now().UnixNano()); e != nil {
		return e.record(true), nil
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
func (s *Store) live(key string, now int64) *entry {
	e, ok := s.records[key]
	if !ok {
		return nil
	}
	if now >= e.expireAt {
		delete(s.records, key)
		return nil
	}
	return e
}

// expire sets e's expiry. The caller holds s.mu.
//
// Each entry has one item in the expiry heap. Extending the expiry (renewal,
// completion with a longer TTL) leaves the item where it is: when it comes
// up, reclaim finds the entry still live and queues it again at its new
// expiry. Only an expiry earlier than the queued one, or a new entry, adds an
// item, so most keys cost one heap push in their lifetime.
func (s *Store) expire(e *entry, expireAt int64) {
	e.expireAt = expireAt
	if e.queuedAt == 0 || expireAt < e.queuedAt {
		e.queuedAt = expireAt
		s.expiry.push(expiryItem{at: expireAt, entry: e})
	}
}

// reclaim removes every record whose expiry has passed. The caller holds s.mu.
func (s *Store) reclaim(now int64) {
	for len(s.expiry) > 0 && now >= s.expiry[0].at {
		it := s.expiry.pop()
		e := it.entry
		if s.records[e.key] != e || it.at != e.queuedAt {
			continue // deleted, replaced, or queued again earlier
		}
		if now < e.expireAt {
			e.queuedAt = e.expireAt
			s.expiry.push(expiryItem{at: e.expireAt, entry: e})
			continue
		}
		delete(s.records, e.key)
	}
}

// cloneKeepEmpty copies b, keeping the difference between nil and empty.
func cloneKeepEmpty(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

// newToken returns a fresh owner token: 128 bits in hex, the store's random
// salt and a sequence number. In process, unique is what matters; the salt
// keeps tokens of different stores apart. The caller holds s.mu.
func (s *Store) newToken() string {
	s.seq++
	var b [16]byte
	copy(b[:8], s.salt[:])
	binary.BigEndian.PutUint64(b[8:], s.seq)
	return hex.EncodeToString(b[:])
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
