package memstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
)

// Store is an in-memory [idempotency.Store], safe for concurrent use.
type Store struct {
	// inProcess: calls never wait on I/O, so they need no timeout.
	//lint:ignore U1000 read through its promoted method, by package inprocess
	inProcess

	now func() time.Time

	mu sync.Mutex
	m  map[string]*record
	// The next sweep comes after max(swept, minSweep) more adds.
	added, swept int
}

var _ idempotency.Store = (*Store)(nil)

// inProcess is an alias, so that the embedded field is unexported.
type inProcess = inprocess.Marker

// minSweep is the fewest records added between two sweeps.
const minSweep = 64

// record is the state of one key.
type record struct {
	state            idempotency.State
	attempts         int
	created, updated time.Time
	// deadline ends the lease; ttl keeps the record after it.
	deadline time.Time
	ttl      time.Duration
	expireAt time.Time
	// token is the owner, or the one whose Complete or Fail made the state.
	token       string
	fingerprint []byte
	result      []byte
}

// New returns an empty store whose clock is now. A nil now means [time.Now].
func New(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{now: now, m: make(map[string]*record)}
}

// Len returns the number of records that have not expired.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(s.now())
	return len(s.m)
}

// Claim implements [idempotency.Store].
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := cmp.Or(storekit.CheckClaim(key, req.Token, req.Lease, req.TTL), ctx.Err()); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("memstore: claim %q: %w", key, err)
	}
	lease, ttl := storekit.ClampTTL(req.Lease), storekit.ClampTTL(req.TTL)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.live(key, now)
	switch {
	case r == nil:
		r = &record{created: now, attempts: 1, fingerprint: bytes.Clone(req.Fingerprint)}
		s.add(key, r, now)
	case len(req.Fingerprint) > 0 && len(r.fingerprint) > 0 && !bytes.Equal(req.Fingerprint, r.fingerprint):
		return idempotency.ClaimResult{Record: r.get(now, false)}, nil
	case r.held(req.Token, now):
		// The owner's resent claim: no new attempt; the lease counts from now.
		r.deadline, r.ttl = now.Add(lease), ttl
		r.expireAt = r.deadline.Add(ttl)
		return idempotency.ClaimResult{Acquired: true, Record: r.get(now, true)}, nil
	case r.state == idempotency.StateFailed || r.lapsed(now):
		// A new attempt: a lapsed lease counted as a failed one.
		r.attempts++
		if len(req.Fingerprint) > 0 {
			r.fingerprint = bytes.Clone(req.Fingerprint)
		}
	default: // COMPLETED, or a live lease of another owner
		return idempotency.ClaimResult{Record: r.get(now, false)}, nil
	}
	r.state, r.token, r.updated = idempotency.StateInProgress, req.Token, now
	r.deadline, r.ttl = now.Add(lease), ttl
	r.expireAt = r.deadline.Add(ttl)
	return idempotency.ClaimResult{Acquired: true, Record: r.get(now, true)}, nil
}

// Renew implements [idempotency.Store].
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	return s.transition(ctx, "renew", key, token, lease, nil)
}

// Complete implements [idempotency.Store].
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.transition(ctx, "complete", key, token, ttl, result)
}

// Fail implements [idempotency.Store].
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.transition(ctx, "fail", key, token, ttl, nil)
}

// transition applies op if token holds key's live lease; a resend of
// token's own Complete or Fail succeeds and changes nothing.
func (s *Store) transition(ctx context.Context, op, key, token string, d time.Duration, result []byte) error {
	if err := cmp.Or(storekit.CheckOwner(key, token, d), ctx.Err()); err != nil {
		return fmt.Errorf("memstore: %s %q: %w", op, key, err)
	}
	d = storekit.ClampTTL(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.live(key, now)
	switch {
	case r == nil:
		return fmt.Errorf("memstore: %s %q: %w", op, key, idempotency.ErrLeaseLost)
	case !r.held(token, now):
		mine := r.token == token
		switch {
		case mine && (op == "complete" && r.state == idempotency.StateCompleted ||
			op == "fail" && r.state == idempotency.StateFailed):
			return nil
		case mine && op == "renew" && r.state == idempotency.StateCompleted:
			return fmt.Errorf("memstore: renew %q: %w", key, idempotency.ErrCompletedByOwner)
		}
		return fmt.Errorf("memstore: %s %q: %w", op, key, idempotency.ErrLeaseLost)
	case op == "renew":
		r.deadline = now.Add(d)
		r.expireAt = r.deadline.Add(r.ttl)
		return nil
	case op == "complete":
		r.state, r.result = idempotency.StateCompleted, bytes.Clone(result)
	default:
		r.state = idempotency.StateFailed
	}
	r.updated, r.expireAt = now, now.Add(d)
	return nil
}

// Release implements [idempotency.Store].
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := cmp.Or(storekit.CheckRelease(key, token), ctx.Err()); err != nil {
		return fmt.Errorf("memstore: release %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.live(key, now)
	switch {
	case r == nil || !r.held(token, now):
		return nil // not token's claim, or already released: a resend
	case r.attempts == 1:
		delete(s.m, key)
		return nil
	}
	r.state, r.attempts, r.token = idempotency.StateFailed, r.attempts-1, ""
	r.updated, r.expireAt = now, now.Add(r.ttl)
	return nil
}

// Get implements [idempotency.Store].
func (s *Store) Get(ctx context.Context, key string) (idempotency.Record, error) {
	if key == "" {
		return idempotency.Record{}, fmt.Errorf("memstore: get: %w", idempotency.ErrEmptyKey)
	}
	if err := ctx.Err(); err != nil {
		return idempotency.Record{}, fmt.Errorf("memstore: get %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if r := s.live(key, now); r != nil {
		return r.get(now, true), nil
	}
	return idempotency.Record{State: idempotency.StateAbsent}, nil
}

// Delete implements [idempotency.Store].
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("memstore: delete: %w", idempotency.ErrEmptyKey)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: delete %q: %w", key, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	return nil
}

// live returns key's record, or nil, removing an expired one. The caller
// holds s.mu.
func (s *Store) live(key string, now time.Time) *record {
	r := s.m[key]
	if r != nil && !now.Before(r.expireAt) {
		delete(s.m, key)
		return nil
	}
	return r
}

// add adds r under key, sweeping first once as many were added as the last
// sweep left. The caller holds s.mu.
func (s *Store) add(key string, r *record, now time.Time) {
	if s.added++; s.added > max(s.swept, minSweep) {
		s.sweep(now)
	}
	s.m[key] = r
}

// sweep removes the expired records. The caller holds s.mu.
func (s *Store) sweep(now time.Time) {
	for k, r := range s.m {
		if !now.Before(r.expireAt) {
			delete(s.m, k)
		}
	}
	s.added, s.swept = 0, len(s.m)
}

// held reports whether token holds r's live lease.
func (r *record) held(token string, now time.Time) bool {
	return r.state == idempotency.StateInProgress && now.Before(r.deadline) && r.token == token
}

// lapsed reports whether r is IN_PROGRESS past its lease's deadline.
func (r *record) lapsed(now time.Time) bool {
	return r.state == idempotency.StateInProgress && !now.Before(r.deadline)
}

// get returns r as a Record at now: a lapsed lease reads as FAILED; the
// token is reported, if withToken, while the lease is live.
func (r *record) get(now time.Time, withToken bool) idempotency.Record {
	rec := idempotency.Record{
		State:     r.state,
		Attempts:  r.attempts,
		CreatedAt: r.created,
		UpdatedAt: r.updated,
	}
	if len(r.fingerprint) > 0 {
		rec.Fingerprint = bytes.Clone(r.fingerprint)
	}
	switch {
	case r.state == idempotency.StateCompleted:
		rec.Result = append([]byte{}, r.result...) // non-nil, even when empty
	case r.state == idempotency.StateInProgress:
		rec.LeaseExpiresAt = r.deadline
		if r.lapsed(now) {
			rec.State = idempotency.StateFailed // the owner stopped renewing
		} else if withToken {
			rec.Token = r.token
		}
	}
	return rec
}
