package memstore

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
)

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

	mu sync.Mutex
	// seed hashes keys with maphash.String, unless hash is set (by tests,
	// to make keys collide).
	seed maphash.Seed
	hash func(string) uint64
	// slots maps the hash of each key to its record's slot (see table.go):
	// s.rec(i) and s.ref(i), in chunks of chunkLen slots; keys with the same
	// hash are chained from it. used counts the slots ever handed out; free
	// lists those of removed records, for reuse; count is the number of
	// records.
	slots  map[uint64]uint32
	count  int
	recs   []*[chunkLen]record
	refs   []*[chunkLen]refs
	used   uint32
	free   []uint32
	expiry expiryQueues
}

var _ idempotency.Store = (*Store)(nil)

// inProcess is an alias, so that the embedded field is unexported.
type inProcess = inprocess.Marker

// record returns a copy of slot i as a Record at now; the token only for
// its owner, and only while the lease is live. owner is the token when the
// caller knows it holds the lease (saving a copy), else "".
func (s *Store) record(i uint32, now int64, withToken bool, owner string) idempotency.Record {
	r := s.rec(i)
	rec := idempotency.Record{
		State:     r.state,
		Attempts:  int(r.attempts),
		CreatedAt: s.at(r.created),
		UpdatedAt: s.at(r.updated),
	}
	if r.fpLen > 0 {
		rec.Fingerprint = bytes.Clone(s.fingerprint(i))
	}
	switch r.state {
	case idempotency.StateCompleted:
		rec.Result = []byte{} // non-nil, even when empty
		if data := s.ref(i).data; len(data) > 0 {
			rec.Result = append(rec.Result, s.result(i)...)
		}
	case idempotency.StateInProgress:
		rec.LeaseExpiresAt = s.at(r.deadline)
		switch {
		case now >= r.deadline:
			rec.State = idempotency.StateFailed // the owner stopped renewing: the attempt failed
		case withToken && owner != "":
			rec.Token = owner
		case withToken:
			rec.Token = s.tokenString(i)
		}
	}
	return rec
}

// New returns an empty store.
func New(cfg Config) *Store {
	return newStore(cfg, nil)
}

// newStore returns an empty store that indexes keys by hash, or by
// maphash.String when hash is nil.
func newStore(cfg Config, hash func(string) uint64) *Store {
	s := &Store{now: cfg.Now, seed: maphash.MakeSeed(), hash: hash, slots: make(map[uint64]uint32)}
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

// after returns the offset d after t, saturating at the largest offset: a
// deadline that overflowed would lie in the past, and a live key would be
// claimable at once. Leases and TTLs are clamped to idempotency.MaxTTL
// already; this keeps a clock far from the store's base safe too.
func after(t, d int64) int64 {
	if t > math.MaxInt64-d {
		return math.MaxInt64
	}
	return t + d
}

// at returns the wall time of the offset t.
func (s *Store) at(t int64) time.Time {
	return s.wallBase.Add(time.Duration(t))
}

// Len returns the number of records held, expired ones not yet reclaimed
// included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Claim implements idempotency.Store.
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := idempotency.CheckClaim(key, req); err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("memstore: claim %q: %w", key, err)
	}
	req.Lease, req.TTL = idempotency.ClampTTL(req.Lease), idempotency.ClampTTL(req.TTL)
	if err := s.lock(ctx, "claim", key); err != nil {
		return idempotency.ClaimResult{}, err
	}
	defer s.mu.Unlock()
	now := s.clock()
	s.reclaim(now)
	i, h, ok := s.live(key, now)
	switch {
	case !ok:
		i = s.add(key, h)
		r := s.rec(i)
		r.created = now
		r.attempts = 1
		s.setData(i, req.Token, req.Fingerprint, nil)
	case len(req.Fingerprint) > 0 && s.rec(i).fpLen > 0 && !bytes.Equal(req.Fingerprint, s.fingerprint(i)):
		return idempotency.ClaimResult{Record: s.record(i, now, false, "")}, nil
	case s.held(i, req.Token, now):
		// The same owner's claim again (a resend whose first reply was lost):
		// acquired, no new attempt, no new transition; only the lease counts
		// from now.
		r := s.rec(i)
		r.deadline = after(now, int64(req.Lease))
		s.extend(i, after(r.deadline, int64(req.TTL)))
		return idempotency.ClaimResult{Acquired: true, Record: s.record(i, now, true, req.Token)}, nil
	case s.rec(i).state == idempotency.StateFailed || s.rec(i).lapsed(now):
		// A new attempt of the same record: a lapsed lease counts as a failed
		// attempt, so a consumer that dies mid-handler still counts. The token
		// that failed (or let its lease lapse) has no hold on the key, so its
		// own claim is a new attempt too.
		s.rec(i).attempts++
		fp := s.fingerprint(i)
		if len(req.Fingerprint) > 0 {
			fp = req.Fingerprint
		}
		s.setData(i, req.Token, fp, nil)
	default: // COMPLETED, or a live lease of another owner
		return idempotency.ClaimResult{Record: s.record(i, now, false, "")}, nil
	}
	r := s.rec(i)
	r.state = idempotency.StateInProgress
	r.updated = now
	r.deadline = after(now, int64(req.Lease))
	s.queue(i, now, after(r.deadline, int64(req.TTL)))
	return idempotency.ClaimResult{Acquired: true, Record: s.record(i, now, true, req.Token)}, nil
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
	d = idempotency.ClampTTL(d)
	if err := s.lock(ctx, opNames[o], key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	now := s.clock()
	s.reclaim(now)
	i, _, ok := s.live(key, now)
	if !ok {
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, idempotency.ErrLeaseLost)
	}
	r := s.rec(i)
	if !s.held(i, token, now) {
		// The token of a COMPLETED or FAILED record is the one whose
		// Complete or Fail made it so: the same call again is a resend.
		resent := (o == opComplete && r.state == idempotency.StateCompleted ||
			o == opFail && r.state == idempotency.StateFailed) &&
			s.hasToken(i, token)
		if resent {
			return nil
		}
		if o == opRenew && r.state == idempotency.StateCompleted && s.hasToken(i, token) {
			return fmt.Errorf("memstore: renew %q: %w", key, idempotency.ErrCompletedByOwner)
		}
		return fmt.Errorf("memstore: %s %q: %w", opNames[o], key, idempotency.ErrLeaseLost)
	}
	switch o {
	case opRenew:
		ttl := r.expireAt - r.deadline
		r.deadline = after(now, int64(d))
		s.extend(i, after(r.deadline, ttl))
		return nil
	case opComplete:
		r.state = idempotency.StateCompleted
		s.setData(i, token, s.fingerprint(i), result)
	case opFail:
		r.state = idempotency.StateFailed
	}
	r.updated = now
	s.queue(i, now, after(now, int64(d)))
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
	if err := s.lock(ctx, "release", key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	now := s.clock()
	s.reclaim(now)
	i, _, ok := s.live(key, now)
	if !ok || !s.held(i, token, now) {
		return nil // not token's claim, or already released: a resend
	}
	r := s.rec(i)
	if r.attempts == 1 {
		s.remove(i)
		return nil
	}
	ttl := r.expireAt - r.deadline // the claim's TTL
	r.state = idempotency.StateFailed
	r.attempts--
	r.deadline = 0
	r.updated = now
	s.setData(i, "", s.fingerprint(i), nil)
	s.queue(i, now, after(now, ttl))
	return nil
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, key string) (idempotency.Record, error) {
	if key == "" {
		return idempotency.Record{}, fmt.Errorf("memstore: get: %w", idempotency.ErrEmptyKey)
	}
	if err := s.lock(ctx, "get", key); err != nil {
		return idempotency.Record{}, err
	}
	defer s.mu.Unlock()
	now := s.clock()
	if i, _, ok := s.live(key, now); ok {
		return s.record(i, now, true, ""), nil
	}
	return idempotency.Record{State: idempotency.StateAbsent}, nil
}

// Delete implements idempotency.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("memstore: delete: %w", idempotency.ErrEmptyKey)
	}
	if err := s.lock(ctx, "delete", key); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if i, _, ok := s.find(key); ok {
		s.remove(i)
	}
	return nil
}

// lock starts a call of op (the method's name, as errors spell it) on key:
// it fails if ctx is done, with the error wrapped with
// op and key, and otherwise returns with s.mu held for the caller to unlock.
func (s *Store) lock(ctx context.Context, op, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %s %q: %w", op, key, err)
	}
	s.mu.Lock()
	return nil
}

// live returns the slot of key's record unless it is missing or expired,
// and key's hash; an expired record is removed on the spot. The caller
// holds s.mu.
func (s *Store) live(key string, now int64) (i uint32, h uint64, ok bool) {
	i, h, ok = s.find(key)
	if ok && now >= s.rec(i).expireAt {
		s.remove(i)
		return 0, h, false
	}
	return i, h, ok
}
