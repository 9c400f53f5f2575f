package idempotency

import (
	"context"
	"errors"
	"time"
)

// Outcome names what happened to one delivery, request or call: the label
// of logs and metrics, from which HTTP problem types and gRPC reasons derive.
type Outcome string

// The outcomes. Each is the snake_case of its name.
const (
	// OutcomeProcessed: the work ran and succeeded; the key is COMPLETED.
	OutcomeProcessed Outcome = "processed"
	// OutcomeOutputNotStored: COMPLETED without an output over MaxOutputSize.
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
	// OutcomeCallerGone: the caller left before the claim's answer; nothing ran.
	OutcomeCallerGone Outcome = "caller_gone"
	// OutcomeFailOpen: the claim failed; [OnceConfig.FailOpen] ran the work.
	OutcomeFailOpen Outcome = "fail_open"
	// OutcomeCompleteFailed: COMPLETED was not written; the work may run again.
	OutcomeCompleteFailed Outcome = "complete_failed"
	// OutcomeLeaseLost: another owner took the key ([ErrLeaseLost]) and may run it.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeCorruptRecord: the value is not a record ([ErrCorruptRecord]).
	OutcomeCorruptRecord Outcome = "corrupt_record"
)

// String returns the outcome's snake_case name.
func (o Outcome) String() string { return string(o) }

// OutcomeOf names the outcome of an error of [Once.Claim] or
// [Lease.Complete]: nil is [OutcomeProcessed], an unknown error
// [OutcomeCompleteFailed].
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

// Observer receives the protocol's measurements; it must be safe for
// concurrent use, and fast. Packages idemprom and idemotel implement it.
type Observer interface {
	// Outcome is called once per delivery, with its context (not to be kept).
	Outcome(ctx context.Context, d OutcomeDetails)
	// StoreLatency is called after every store call. op is "claim",
	// "renew", "complete", "fail" or "release".
	StoreLatency(op string, d time.Duration, err error)
	// CacheLookup is called per claim while the cache is on; hit: it answered.
	CacheLookup(handler string, hit bool)
}

// OutcomeDetails describe one outcome for [Observer.Outcome].
type OutcomeDetails struct {
	// Handler is the Watermill handler, HTTP route, gRPC method, or "once".
	Handler string
	// Key is the stored key, or empty. Hash it before export.
	Key string
	// Outcome is what happened.
	Outcome Outcome
	// Attempt is the key's attempt count after the claim, or 0.
	Attempt int
	// Err is the outcome's error; nil for processed and duplicate.
	Err error
}
