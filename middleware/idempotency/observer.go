package idempotency

import (
	"context"
	"errors"
	"time"
)

// Outcome names what happened to one delivery, request or call. It is the
// label of logs and metrics, and the one table from which the HTTP
// problem types and the gRPC reasons derive.
type Outcome string

// The outcomes. Each is the snake_case of its name.
const (
	// OutcomeProcessed: the work ran and succeeded; the key is COMPLETED.
	OutcomeProcessed Outcome = "processed"
	// OutcomeOutputNotStored: the work succeeded, but its output was over
	// [OnceConfig.MaxOutputSize]; the key is COMPLETED without it.
	OutcomeOutputNotStored Outcome = "output_not_stored"
	// OutcomeHandlerFailed: the work failed or panicked; the key is FAILED.
	OutcomeHandlerFailed Outcome = "handler_failed"
	// OutcomeDuplicate: the key was COMPLETED; its stored output is replayed.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeInProgress: another owner holds the key ([ErrInProgress]).
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeMissingKey: no key could be derived ([ErrMissingKey]).
	OutcomeMissingKey Outcome = "missing_key"
	// OutcomeTooManyAttempts: the work ran MaxAttempts times ([ErrTooManyAttempts]).
	OutcomeTooManyAttempts Outcome = "too_many_attempts"
	// OutcomeKeyReused: the key came with other content ([ErrKeyReused]).
	OutcomeKeyReused Outcome = "key_reused"
	// OutcomeStoreUnavailable: the claim failed; nothing ran ([ErrStoreUnavailable]).
	OutcomeStoreUnavailable Outcome = "store_unavailable"
	// OutcomeCallerGone: the caller's context ended before the store
	// answered the claim; nothing ran. It is no sign of a store that is down.
	OutcomeCallerGone Outcome = "caller_gone"
	// OutcomeFailOpen: the claim failed and [OnceConfig.FailOpen] ran the
	// work without deduplication.
	OutcomeFailOpen Outcome = "fail_open"
	// OutcomeCompleteFailed: the work succeeded, but COMPLETED could not be
	// written within the lease; a later copy may run the work again.
	OutcomeCompleteFailed Outcome = "complete_failed"
	// OutcomeLeaseLost: the work succeeded, but another owner took the key
	// ([ErrLeaseLost]); it may have run the work too.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeCorruptRecord: the value under the key is not a record
	// ([ErrCorruptRecord]); nothing ran.
	OutcomeCorruptRecord Outcome = "corrupt_record"
)

// String returns the outcome's snake_case name.
func (o Outcome) String() string { return string(o) }

// OutcomeOf names the outcome of an error of [Once.Claim] or
// [Lease.Complete]. A nil error is [OutcomeProcessed]. An error that matches
// none of the protocol's sentinels is [OutcomeCompleteFailed]: only
// Lease.Complete returns such errors.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeProcessed
	case errors.Is(err, ErrMissingKey):
		return OutcomeMissingKey
	case errors.Is(err, ErrCorruptRecord):
		return OutcomeCorruptRecord
	case errors.Is(err, ErrTooManyAttempts):
		return OutcomeTooManyAttempts
	case errors.Is(err, ErrKeyReused):
		return OutcomeKeyReused
	case errors.Is(err, ErrInProgress):
		return OutcomeInProgress
	case errors.Is(err, ErrLeaseLost):
		return OutcomeLeaseLost
	case errors.Is(err, errCallerGone):
		return OutcomeCallerGone
	case errors.Is(err, ErrStoreUnavailable):
		return OutcomeStoreUnavailable
	}
	return OutcomeCompleteFailed
}

// Observer receives the protocol's measurements. Implementations must be
// safe for concurrent use, and fast: they run on every message. Package
// idemprom implements it for Prometheus, package idemotel for
// OpenTelemetry.
type Observer interface {
	// Outcome is called once per delivery, request or call. ctx is the
	// message's or request's context; it may be done, and must not be kept.
	Outcome(ctx context.Context, d OutcomeDetails)
	// StoreLatency is called after every store call. op is "claim",
	// "renew", "complete", "fail" or "release".
	StoreLatency(op string, d time.Duration, err error)
	// CacheLookup is called once per claim while the cache is on, before
	// any store call: hit says the cache answered it.
	CacheLookup(handler string, hit bool)
}

// OutcomeDetails describe one outcome for [Observer.Outcome].
type OutcomeDetails struct {
	// Handler is a low-cardinality label: the Watermill handler's name,
	// the HTTP route or the gRPC method, or "once" for [Once.Do]. It never
	// holds a tenant's identity.
	Handler string
	// Key is the stored key; empty when none was derived. It may carry
	// user data: hash it before export.
	Key string
	// Outcome is what happened.
	Outcome Outcome
	// Attempt is the key's attempt count after the claim; 0 when no
	// record was read.
	Attempt int
	// Err is the error reported with the outcome; nil for processed and
	// duplicate.
	Err error
}
