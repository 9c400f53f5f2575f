package idempotency

import (
	"context"
	"time"
)

// State is the lifecycle state of one idempotency key.
type State uint8

const (
	// StateAbsent: no record, never claimed or expired.
	StateAbsent State = iota
	// StateInProgress: one owner holds a lease and runs the effect.
	StateInProgress
	// StateCompleted: the effect happened; the record holds its result.
	StateCompleted
	// StateFailed: the last attempt failed; the key may be claimed again.
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

// Entry is one stored record, as the stores' Records methods list it.
type Entry struct {
	// Key is the key as stored, the store's prefix included.
	Key string
	// Record is the key's record; StateAbsent when it expired while listed.
	Record Record
	// TTL is the time left before the store forgets the key; 0 when unknown.
	TTL time.Duration
	// Bytes is the record's stored size; 0 when unknown.
	Bytes int64
	// Err, wrapping ErrCorruptRecord, marks a record that does not decode.
	Err error
}

// Record is what a store knows about one key.
type Record struct {
	// State is the key's state. A lapsed lease reads as StateFailed.
	State State
	// Token is the owner's token while StateInProgress, else empty. Claim
	// reports it only to its owner.
	Token string
	// Attempts counts the claims that started a run: 1 after the first,
	// +1 per claim of a FAILED or lapsed key, until the record expires.
	Attempts int
	// Result is what Complete stored: nil unless StateCompleted, non-nil
	// when completed with an empty result.
	Result []byte
	// Fingerprint is that of the Claim that created the record, or nil.
	Fingerprint []byte
	// CreatedAt is the first claim's time, by the store's clock.
	CreatedAt time.Time
	// UpdatedAt is the last transition's time, by the store's clock.
	UpdatedAt time.Time
	// LeaseExpiresAt is when the last lease ends or ended, by the store's
	// clock; zero for a record completed or failed by its owner.
	//
	// A claim of an absent key may report its three times from the client's
	// clock at the send (redisstore does). The owner protocol never relies
	// on them: it counts the lease on its own monotonic clock.
	LeaseExpiresAt time.Time
}

// ClaimRequest is what Store.Claim is asked to install.
type ClaimRequest struct {
	// Token is the owner token the claim installs. Required.
	Token string
	// Lease is how long the claim holds the key without renewal. Required.
	Lease time.Duration
	// TTL keeps the record after its lease lapses, so the attempt counts.
	// Required; Once passes FailedTTL.
	TTL time.Duration
	// Fingerprint, a hash of the request, is stored with a new record.
	Fingerprint []byte
}

// ClaimResult is the outcome of Store.Claim and Once.Claim.
type ClaimResult struct {
	// Acquired: the caller owns the key and must run the effect, then
	// Complete or Fail it.
	Acquired bool
	// Record is the caller's record when Acquired, else the one that
	// refused the claim.
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
// Every method honours ctx. Every transition is one atomic operation of
// the store, so any number of processes may share it. Expiry is the store's
// own, on its clock. A duration that is not positive is [ErrInvalidTTL],
// never "no expiry"; an empty key is [ErrEmptyKey], an empty token
// [ErrEmptyToken]. Keys and values are arbitrary bytes.
//
// Every transition is idempotent for its owner: a resent Claim, Complete or
// Fail of the token succeeds again, changing nothing.
//
// A value that is not a record is [ErrCorruptRecord], wrapped with the key,
// from every method that reads it: never a duplicate, never overwritten.
//
// Implementations must pass storetest.Run.
type Store interface {
	// Claim acquires an ABSENT, FAILED or lapsed key: it is then
	// IN_PROGRESS under req.Token for req.Lease. It acquires again, counting
	// no attempt, when req.Token holds the key. Otherwise it changes nothing
	// and returns the record. Two non-empty fingerprints that differ never
	// acquire.
	Claim(ctx context.Context, key string, req ClaimRequest) (ClaimResult, error)

	// Renew extends token's live lease to lease from now, else ErrLeaseLost.
	Renew(ctx context.Context, key, token string, lease time.Duration) error

	// Complete moves token's live lease to COMPLETED with result, kept for
	// ttl, else ErrLeaseLost. A resend returns nil.
	Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error

	// Fail moves token's live lease to FAILED, kept for ttl, else
	// ErrLeaseLost. A resend returns nil.
	Fail(ctx context.Context, key, token string, ttl time.Duration) error

	// Release undoes token's claim whose outcome the caller never learned:
	// a first attempt's record goes, a later one is FAILED with one attempt
	// fewer, kept for the claim's TTL. Otherwise it changes nothing and
	// returns nil.
	Release(ctx context.Context, key, token string) error

	// Get returns the key's record; StateAbsent when there is none.
	Get(ctx context.Context, key string) (Record, error)

	// Delete removes the key's record, corrupt or not. An absent key is no error.
	Delete(ctx context.Context, key string) error
}
