package idempotency

import (
	"context"
	"time"
)

// State is the lifecycle state of one idempotency key.
type State uint8

const (
	// StateAbsent means the store holds no record for the key: it was never
	// claimed, or its record expired.
	StateAbsent State = iota
	// StateInProgress means one owner holds a lease on the key and is running
	// its effect.
	StateInProgress
	// StateCompleted means the effect happened; the record carries its result.
	StateCompleted
	// StateFailed means the last attempt failed; the key may be claimed again.
	StateFailed
)

// String returns the state's name as used in logs and metrics.
func (s State) String() string {
	switch s {
	case StateAbsent:
		return "absent"
	case StateInProgress:
		return "in_progress"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	default:
		return "unknown"
	}
}

// Entry is one stored record as a store lists it for inspection
// (cmd/idemctl): the stores' Records methods yield it.
type Entry struct {
	// Key is the key as stored, the store's prefix included.
	Key string
	// Record is the key's record; StateAbsent when it expired while listed.
	Record Record
	// TTL is the time left before the store forgets the key; 0 when unknown.
	TTL time.Duration
	// Bytes is the record's stored size; 0 when unknown.
	Bytes int64
	// Err, wrapping ErrCorruptRecord, is set for a record that does not
	// decode; the listing goes on after it.
	Err error
}

// Record is what a store knows about one key: what Store.Get returns to the
// tools that inspect keys (cmd/idemctl), and what a claim found
// (ClaimResult).
type Record struct {
	// State is the key's state; StateAbsent for a key the store does not hold.
	// A lease that lapsed (its owner stopped renewing it and never called
	// Complete or Fail) reads as StateFailed: the attempt failed.
	State State
	// Token is the current owner's token while State is StateInProgress, and
	// empty otherwise. Claim reports it only to its owner: the record of a
	// key held by someone else comes back without its token.
	Token string
	// Attempts counts the claims that started a run of the effect: 1 after
	// the first claim, +1 for every claim of a FAILED key or of a lease that
	// lapsed. It restarts from 1 only when the record itself expires.
	Attempts int
	// Result is the output stored by Complete; nil unless State is
	// StateCompleted. A completed record with an empty result has a non-nil,
	// zero-length Result.
	Result []byte
	// Fingerprint is the value passed to the Claim that created the record,
	// typically a hash of the payload; nil when none was given.
	Fingerprint []byte
	// CreatedAt is when the record was first claimed, by the store's clock.
	CreatedAt time.Time
	// UpdatedAt is the time of the record's last transition, by the store's
	// clock.
	UpdatedAt time.Time
	// LeaseExpiresAt is when the last lease ends or ended, by the store's
	// clock: in the future while State is StateInProgress, in the past for a
	// FAILED record whose lease lapsed, and zero otherwise.
	//
	// One exception to "by the store's clock": a store may answer a claim
	// that installed a new record without reading its clock, and report that
	// record's three times from the client's clock at the send (redisstore
	// does on Redis 7; see its documentation). The times the store keeps,
	// which Get and every later transition read, are still its own. The
	// owner protocol never relies on a claim's reported times: it counts the
	// lease on its own monotonic clock from before the claim was sent.
	LeaseExpiresAt time.Time
}

// ClaimRequest is what Store.Claim is asked to install. Once builds it;
// stores, and code that calls a store directly, use it.
type ClaimRequest struct {
	// Token is the owner token the claim installs. A
	// claim resent with the token that already holds the key acquires it
	// again without counting another attempt, so a client that resends a
	// claim whose reply was lost is not refused by its own first try.
	// Required.
	Token string
	// Lease is how long the claim holds the key without renewal. Required,
	// positive.
	Lease time.Duration
	// TTL is how long the record is kept after its lease lapses, when its
	// owner neither completes nor fails it (it crashed): the lapsed attempt
	// still counts towards the next claim's Attempts. Required, positive;
	// the middleware passes its FailedTTL.
	TTL time.Duration
	// Fingerprint, typically a hash of the request, is stored with a new
	// record; nil for none.
	Fingerprint []byte
}

// ClaimResult is the outcome of Store.Claim, and of Once.Claim for an
// adapter: when the claim was refused, its Record says why.
type ClaimResult struct {
	// Acquired is true when the caller now owns the key (it is IN_PROGRESS
	// with the request's Token) and must run the effect, then call Complete
	// or Fail. It is false when the key is held by another owner, already
	// completed, or when the stored fingerprint differs from the one given.
	Acquired bool
	// Record is the key's record after the claim: the caller's IN_PROGRESS
	// record when Acquired, else the record that prevented the claim
	// (COMPLETED with its Result, IN_PROGRESS held by another owner, or any
	// state whose Fingerprint differs from the one given).
	Record Record
}

// Store keeps the idempotency state machine of every key:
//
//	ABSENT ──Claim──▶ IN_PROGRESS ──Complete──▶ COMPLETED ──(ttl)──▶ ABSENT
//	                     │  ▲  └──(lease lapses)──▶ FAILED
//	                   Fail│  │Claim (Attempts+1)
//	                       ▼  │
//	                      FAILED ──(ttl)──▶ ABSENT
//
// Every method takes ctx first and honours its cancellation. Every transition
// is one atomic operation of the store (for Redis, one script call), so any
// number of processes may share a store. Expiry is enforced by the store
// itself, on its own clock, never by comparing the clocks of different
// hosts. Every duration must be positive: a zero or negative TTL is
// ErrInvalidTTL, never "no expiry". An empty key is ErrEmptyKey, an empty
// token ErrEmptyToken. Keys and values are arbitrary bytes.
//
// Every transition is idempotent for its owner, because clients resend a
// command whose reply was lost: a Claim resent with the token that holds the
// key acquires it again, and a Complete or Fail resent after its first try
// was applied succeeds again, changing nothing.
//
// A value under a key that is not a well-formed record of the store's is
// ErrCorruptRecord (wrapped with the key) from every method that reads it:
// it is never taken for a duplicate, never overwritten, and never a panic.
//
// Implementations must pass storetest.Run.
type Store interface {
	// Claim takes the key for a new run when it is ABSENT, FAILED, or
	// IN_PROGRESS with a lapsed lease, and returns Acquired=true; the key is
	// then IN_PROGRESS under req.Token for req.Lease. It also returns
	// Acquired=true, counting no attempt, when req.Token already holds the
	// key. Otherwise it changes nothing and returns the current record with
	// Acquired=false.
	//
	// When both req.Fingerprint and the stored record's fingerprint are
	// non-empty and differ, Claim never acquires, whatever the state, and
	// returns the stored record so the caller can report a reused key.
	Claim(ctx context.Context, key string, req ClaimRequest) (ClaimResult, error)

	// Renew extends the lease of an IN_PROGRESS key to lease from now. It
	// returns ErrLeaseLost unless token holds a lease that has not lapsed.
	Renew(ctx context.Context, key, token string, lease time.Duration) error

	// Complete moves an IN_PROGRESS key to COMPLETED with result, kept for
	// ttl. It returns ErrLeaseLost, changing nothing, unless token holds a
	// lease that has not lapsed, or token's own Complete was already applied
	// (then it returns nil and changes nothing).
	Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error

	// Fail moves an IN_PROGRESS key to FAILED, kept for ttl, so the next
	// Claim may run the effect again. It returns ErrLeaseLost, changing
	// nothing, unless token holds a lease that has not lapsed, or token's
	// own Fail was the key's last transition (then it returns nil).
	Fail(ctx context.Context, key, token string, ttl time.Duration) error

	// Release undoes a claim whose outcome the caller never learned (its
	// reply was lost or its call timed out), before any work ran: if token
	// holds the key's lease, the record goes back to what the claim found —
	// gone for a first attempt, FAILED with one attempt fewer otherwise,
	// kept for the claim's ClaimRequest.TTL from now — so
	// that the key neither stalls until the lease lapses nor counts an
	// attempt that never ran. When token does not hold the key (the claim
	// never happened, or was already released) it changes nothing and
	// returns nil: a resent Release is harmless.
	Release(ctx context.Context, key, token string) error

	// Get returns the key's record; a key the store does not hold is a
	// Record with State StateAbsent and a nil error.
	Get(ctx context.Context, key string) (Record, error)

	// Delete removes the key's record whatever its state, corrupt ones
	// included, so the next Claim starts afresh. Deleting an absent key is
	// not an error.
	Delete(ctx context.Context, key string) error
}
