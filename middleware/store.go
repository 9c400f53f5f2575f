package middleware

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

// Record is what a store knows about one key.
type Record struct {
	// State is the key's state; StateAbsent for a key the store does not hold.
	State State
	// Token is the current owner's token while State is StateInProgress, and
	// empty otherwise. Claim reports it only to the owner it creates: the
	// record of a key held by someone else comes back without its token.
	Token string
	// Attempts counts the claims that started a run of the effect: 1 after the
	// first claim, +1 for every claim of a FAILED key. It restarts from 1 when
	// the record expires (including a lease that expired after a crash).
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
}

// ClaimResult is the outcome of Store.Claim.
type ClaimResult struct {
	// Acquired is true when the caller now owns the key (it is IN_PROGRESS
	// with Token) and must run the effect, then call Complete or Fail.
	// It is false when the key is held by someone else, already completed, or
	// when the stored fingerprint differs from the one given.
	Acquired bool
	// Token is the new owner token when Acquired; empty otherwise.
	Token string
	// Record is the key's record after the claim: the caller's fresh
	// IN_PROGRESS record when Acquired, else the record that prevented the
	// claim (COMPLETED with its Result, IN_PROGRESS held by another owner, or
	// any state whose Fingerprint differs from the one given).
	Record Record
}

// Store keeps the idempotency state machine of every key:
//
//	ABSENT ──Claim──▶ IN_PROGRESS ──Complete──▶ COMPLETED ──(ttl)──▶ ABSENT
//	                     │  ▲  └──(lease expires)──▶ ABSENT
//	                   Fail│  │Claim (Attempts+1)
//	                       ▼  │
//	                      FAILED ──(ttl)──▶ ABSENT
//
// Every method takes ctx first and honours its cancellation. Every transition
// is one atomic operation of the store (for Redis, one script call), so any
// number of processes may share a store. Expiry is enforced by the store
// itself, never by comparing the clocks of different hosts. Every duration
// must be positive: a zero or negative TTL is ErrInvalidTTL, never "no
// expiry". An empty key is ErrEmptyKey. Keys and values are arbitrary bytes.
//
// Implementations must pass storetest.Run.
type Store interface {
	// Claim takes the key for a new run when it is ABSENT or FAILED (a lease
	// that expired makes it ABSENT), and returns Acquired=true with a fresh
	// owner token; the key is then IN_PROGRESS for lease. Otherwise it changes
	// nothing and returns the current record with Acquired=false.
	//
	// fingerprint may be nil. When both it and the stored record's
	// fingerprint are non-empty and differ, Claim never acquires, whatever
	// the state, and returns the stored record so the caller can report a
	// reused key.
	Claim(ctx context.Context, key string, lease time.Duration, fingerprint []byte) (ClaimResult, error)

	// Renew extends the lease of an IN_PROGRESS key to lease from now. It
	// returns ErrLeaseLost unless token is the current owner's.
	Renew(ctx context.Context, key, token string, lease time.Duration) error

	// Complete moves an IN_PROGRESS key to COMPLETED with result, kept for
	// ttl. It returns ErrLeaseLost, changing nothing, unless token is the
	// current owner's.
	Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error

	// Fail moves an IN_PROGRESS key to FAILED, kept for ttl, so the next
	// Claim may run the effect again. It returns ErrLeaseLost, changing
	// nothing, unless token is the current owner's.
	Fail(ctx context.Context, key, token string, ttl time.Duration) error

	// Get returns the key's record; a key the store does not hold is a
	// Record with State StateAbsent and a nil error.
	Get(ctx context.Context, key string) (Record, error)

	// Delete removes the key's record whatever its state, so the next Claim
	// starts afresh. Deleting an absent key is not an error.
	Delete(ctx context.Context, key string) error
}

// InProcessStore is implemented by stores whose calls never wait on a
// network or a disk, such as memstore. The middleware calls them without the
// Config.StoreTimeout context it puts around every call of other stores,
// saving a timer per call on the hot path.
type InProcessStore interface {
	Store
	// InProcess marks the store; it is never called.
	InProcess()
}
