package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
)

// ErrClosed is returned, wrapped with the operation and key, by every method
// of a store after Close.
var ErrClosed = errors.New("memstore: closed")

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Now returns the current time. Zero means the process's monotonic clock
	// (time.Now's monotonic reading), which a step of the wall clock does not
	// move. Tests inject a fake clock here to move through leases and TTLs
	// without sleeping; the store measures intervals between its readings
	// with time.Time.Sub, so readings without a monotonic reading (time.Unix,
	// time.Date, ...) are compared by their wall times.
	Now func() time.Time
}

// Store is an in-memory idempotency.Store, safe for concurrent use.
type Store struct {
	// inProcess marks the store as one whose calls never wait on I/O, so
	// the owner protocol calls it without a per-call timeout.
	//lint:ignore U1000 read through its promoted method, by package inprocess
	inProcess

	// base is the clock's reading at New. Every time the store keeps is an
	// offset from it, measured with Sub, so with the default clock it is a
	// monotonic interval and a wall-clock step moves nothing.
	base time.Time
	// wallBase is base without its monotonic reading: reported times are
	// wallBase plus an offset, plain wall times like those of other stores.
	wallBase time.Time
	// now is Config.Now; nil for the default clock.
	now func() time.Time

	mu      sync.Mutex
	closed  bool
	records map[string]*entry
	expiry  expiryHeap
}

var _ idempotency.Store = (*Store)(nil)

// inProcess is an alias, so that the embedded field is unexported.
type inProcess = inprocess.Marker

// entry is one record, kept compact (times as nanosecond offsets from the
// store's base, few pointers): a busy store holds millions of them and the
// garbage collector scans them all.
type entry struct {
	key string
	// token is the owner's while the stored state is IN_PROGRESS (its lease
	// live or lapsed), and the token whose Complete or Fail made the record
	// COMPLETED or FAILED otherwise, so that the same owner's resent Complete
	// or Fail is recognised; empty for a FAILED record that a Release made,
	// which no resend matches. It is reported only for a live lease.
	token       string
	result      []byte // non-nil once COMPLETED
	fingerprint []byte
	created     int64
	updated     int64
	// deadline is the end of the lease while the stored state is
	// IN_PROGRESS; past it the lease has lapsed and the record reads as
	// FAILED. While IN_PROGRESS, expireAt-deadline is the claim's TTL, so
	// the TTL needs no field of its own.
	deadline int64
	// expireAt is the record's expiry.
	expireAt int64
	// queuedAt is the time of this entry's one item in the expiry heap when
	// queued: never after expireAt, so the item comes up no later than the
	// record expires.
	queuedAt int64
	attempts int32
	state    idempotency.State // as stored: a lapsed lease stays IN_PROGRESS here
	queued   bool
}

// lapsed reports whether e is an IN_PROGRESS record whose lease has ended.
func (e *entry) lapsed(now int64) bool {
	return e.state == idempotency.StateInProgress && now >= e.deadline
}

// held reports whether token holds e's live lease.
func (e *entry) held(token string, now int64) bool {
	return e.state == idempotency.StateInProgress && now < e.deadline && e.token == token
}

// record returns a copy of e as a Record at now; the token only for its
// owner, and only while the lease is live.
func (s *Store) record(e *entry, now int64, withToken bool) idempotency.Record {
	rec := idempotency.Record{
		State:       e.state,
		Attempts:    int(e.attempts),
		Result:      cloneKeepEmpty(e.result),
		Fingerprint: bytes.Clone(e.fingerprint),
		CreatedAt:   s.at(e.created),
		UpdatedAt:   s.at(e.updated),
	}
	if e.state == idempotency.StateInProgress {
		rec.LeaseExpiresAt = s.at(e.deadline)
		switch {
		case now >= e.deadline:
			rec.State = idempotency.StateFailed // the owner stopped renewing: the attempt failed
		case withToken:
			rec.Token = e.token
		}
	}
	return rec
}

// New returns an empty store.
func New(cfg Config) *Store {
	s := &Store{now: cfg.Now, records: make(map[string]*entry)}
	if s.now == nil {
		s.base = time.Now()
	} else {
		s.base = s.now()
	}
	s.wallBase = s.base.Round(0)
	return s
}

// clock returns the current time as an offset from s.base.
func (s *Store) clock() int64 {
	if s.now == nil {
		return int64(time.Since(s.base)) // monotonic: base carries time.Now's reading
	}
	return int64(s.now().Sub(s.base))
}

// at returns the wall time of the offset t.
func (s *Store) at(t int64) time.Time {
	return s.wallBase.Add(time.Duration(t))
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

// Claim implements idempotency.Store.
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := idempotency.CheckClaim(key, req); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("memstore: claim %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("memstore: claim %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return idempotency.ClaimResult{}, fmt.Errorf("memstore: claim %q: %w", key, ErrClosed)
	}
	now := s.clock()
	s.reclaim(now)
	e := s.live(key, now)
	switch {
	case e == nil:
		e = &entry{key: key, created: now, attempts: 1, fingerprint: bytes.Clone(req.Fingerprint)}
		s.records[key] = e
	case len(req.Fingerprint) > 0 && len(e.fingerprint) > 0 && !bytes.Equal(req.Fingerprint, e.fingerprint):
		return idempotency.ClaimResult{Record: s.record(e, now, false)}, nil
	case e.held(req.Token, now):
		// The same owner's claim again (a resend whose first reply was lost):
		// acquired, no new attempt, no new transition; only the lease counts
		// from now.
		e.deadline = now + int64(req.Lease)
		s.expire(e, e.deadline+int64(req.TTL))
		return idempotency.ClaimResult{Acquired: true, Record: s.record(e, now, true)}, nil
	case e.state == idempotency.StateFailed || e.lapsed(now):
		// A new attempt of the same record: a lapsed lease counts as a failed
		// attempt, so a consumer that dies mid-handler still counts. The token
		// that failed (or let its lease lapse) has no hold on the key, so its
		// own claim is a new attempt too.
		e.attempts++
		if len(req.Fingerprint) > 0 {
			e.fingerprint = bytes.Clone(req.Fingerprint)
		}
	default: // COMPLETED, or a live lease of another owner
		return idempotency.ClaimResult{Record: s.record(e, now, false)}, nil
	}
	e.state = idempotency.StateInProgress
	e.token = req.Token
	e.updated = now
	e.deadline = now + int64(req.Lease)
	s.expire(e, e.deadline+int64(req.TTL))
	return idempotency.ClaimResult{Acquired: true, Record: s.record(e, now, true)}, nil
}

// Renew implements idempotency.Store. It moves the lease deadline to lease
// from now and the record's expiry with it, keeping the claim's TTL after
// the deadline.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	return s.transition(ctx, opRenew, key, token, lease, nil)
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.transition(ctx, opComplete, key, token, ttl, result)
}

// Fail implements idempotency.Store.
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

// transition applies o to the record of key if token holds its live lease.
// A Complete or Fail that token already applied (its resend) changes nothing
// and succeeds.
func (s *Store) transition(ctx context.Context, o op, key, token string, d time.Duration, result []byte) error {
	if err := idempotency.CheckOwner(key, token, d); err != nil {
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, ErrClosed)
	}
	now := s.clock()
	s.reclaim(now)
	e := s.live(key, now)
	if e == nil {
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, idempotency.ErrLeaseLost)
	}
	if !e.held(token, now) {
		// The token of a COMPLETED or FAILED record is the one whose
		// Complete or Fail made it so: the same call again is a resend.
		resent := e.token == token &&
			(o == opComplete && e.state == idempotency.StateCompleted ||
				o == opFail && e.state == idempotency.StateFailed)
		if resent {
			return nil
		}
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, idempotency.ErrLeaseLost)
	}
	switch o {
	case opRenew:
		ttl := e.expireAt - e.deadline
		e.deadline = now + int64(d)
		s.expire(e, e.deadline+ttl)
		return nil
	case opComplete:
		e.state = idempotency.StateCompleted
		e.result = append(make([]byte, 0, len(result)), result...)
	case opFail:
		e.state = idempotency.StateFailed
	}
	e.updated = now
	s.expire(e, now+int64(d))
	return nil
}

// Release implements idempotency.Store. A live lease of token is undone: a
// first attempt's record is removed, and a later attempt's goes back to
// FAILED with one attempt fewer and no token (so no earlier owner's resent
// Fail or Complete matches it), kept for the claim's TTL from now. Anything
// else (another owner, a lapsed lease, a COMPLETED, FAILED or absent key) is
// left as it is, and nil returned.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := idempotency.CheckRelease(key, token); err != nil {
		return fmt.Errorf("memstore: release %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: release %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memstore: release %q: %w", key, ErrClosed)
	}
	now := s.clock()
	s.reclaim(now)
	e := s.live(key, now)
	if e == nil || !e.held(token, now) {
		return nil // not token's claim, or already released: a resend
	}
	if e.attempts == 1 {
		delete(s.records, key) // its heap item is dropped when it comes up
		return nil
	}
	ttl := e.expireAt - e.deadline // the claim's TTL
	e.state = idempotency.StateFailed
	e.attempts--
	e.token = ""
	e.deadline = 0
	e.updated = now
	s.expire(e, now+ttl)
	return nil
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, key string) (idempotency.Record, error) {
	if key == "" {
		return idempotency.Record{}, fmt.Errorf("memstore: get: %w", idempotency.ErrEmptyKey)
	}
	if err := ctx.Err(); err != nil {
		return idempotency.Record{}, fmt.Errorf("memstore: get %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return idempotency.Record{}, fmt.Errorf("memstore: get %q: %w", key, ErrClosed)
	}
	now := s.clock()
	if e := s.live(key, now); e != nil {
		return s.record(e, now, true), nil
	}
	return idempotency.Record{State: idempotency.StateAbsent}, nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("memstore: delete: %w", idempotency.ErrEmptyKey)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: delete %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memstore: delete %q: %w", key, ErrClosed)
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
	if !e.queued || expireAt < e.queuedAt {
		e.queued = true
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

type expiryItem struct {
	at    int64 // offset from the store's base
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
