package idempotency

import (
	"context"
	"time"
)

// Outcome names what the middleware did with one delivery; it is the label
// of logs and metrics.
type Outcome string

// The outcomes of one delivery.
const (
	// OutcomeProcessed: the handler ran and succeeded; the key is COMPLETED.
	OutcomeProcessed Outcome = "processed"
	// OutcomeOutputNotStored: the handler ran and succeeded, and the key is
	// COMPLETED, but its output was larger than Config.MaxOutputSize and
	// was not stored (ErrOutputNotStored). The router publishes it, then
	// acks; should that publish fail, the redelivery is acked as a
	// duplicate without the output, which is then lost: outputs over
	// MaxOutputSize are at most once.
	OutcomeOutputNotStored Outcome = "output_not_stored"
	// OutcomeHandlerFailed: the handler ran and returned an error (or
	// panicked); the key is FAILED and the message nacked.
	OutcomeHandlerFailed Outcome = "handler_failed"
	// OutcomeDuplicate: the key was COMPLETED; the handler was skipped, the
	// stored output returned and the message acked.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeInProgress: another consumer holds the key; nacked for later.
	OutcomeInProgress Outcome = "in_progress"
	// OutcomeMissingKey: no key could be derived; ErrMissingKey.
	OutcomeMissingKey Outcome = "missing_key"
	// OutcomeTooManyAttempts: ErrTooManyAttempts, the handler was not run.
	OutcomeTooManyAttempts Outcome = "too_many_attempts"
	// OutcomeKeyReused: ErrKeyReused, the handler was not run.
	OutcomeKeyReused Outcome = "key_reused"
	// OutcomeStoreUnavailable: the claim failed; nacked (fail closed).
	OutcomeStoreUnavailable Outcome = "store_unavailable"
	// OutcomeCallerGone: the caller gave up (its context ended) before the
	// store answered the claim; nothing ran. HTTP, gRPC and Once.Do count
	// it in place of OutcomeStoreUnavailable: a caller with a short
	// deadline is no sign of a store that is down. But a store that is
	// down is only caller_gone to callers whose deadlines are shorter than
	// StoreTimeout: alert when it is most outcomes.
	OutcomeCallerGone Outcome = "caller_gone"
	// OutcomeFailOpen: the claim failed and Config.FailOpen ran the handler
	// without deduplication.
	OutcomeFailOpen Outcome = "fail_open"
	// OutcomeCompleteFailed: the handler succeeded but COMPLETED could not be
	// written within the lease; the message is still acked and its output
	// returned, and a later copy may run the handler again.
	OutcomeCompleteFailed Outcome = "complete_failed"
	// OutcomeLeaseLost: the handler succeeded, but the store said, within
	// the lease, that its token no longer holds the key: another consumer
	// took it over, or an operator deleted it. The message is acked, and the
	// other consumer may have run the handler too (a handler longer than
	// the lease whose renewals could not reach the store).
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeCorruptRecord: the value under the key is not a record of the
	// store's (ErrCorruptRecord); nothing ran, the message is nacked (HTTP:
	// 500) and the key is left for an operator to inspect and delete.
	OutcomeCorruptRecord Outcome = "corrupt_record"
)

// Op names a store operation for Observer.StoreLatency, so that an
// Observer can label its latency metrics; package idemprom uses it as the
// "op" label.
type Op string

// The store operations of the owner protocol, as Observer.StoreLatency
// reports them.
const (
	// OpClaim is Store.Claim: a delivery or request claims its key.
	OpClaim Op = "claim"
	// OpRenew is Store.Renew: the owner extends its lease while the work
	// runs.
	OpRenew Op = "renew"
	// OpComplete is Store.Complete: the owner records its result.
	OpComplete Op = "complete"
	// OpFail is Store.Fail: the owner records a failed attempt.
	OpFail Op = "fail"
	// OpRelease is Store.Release: a claim whose reply was lost is undone.
	OpRelease Op = "release"
)

// Observer receives the middleware's measurements. Implementations must be
// safe for concurrent use and fast: they run on every message. The
// idemprom package provides one for Prometheus.
type Observer interface {
	// Outcome is called once per delivery or request with a low-cardinality
	// label and what happened: the Watermill handler's name (the scope),
	// the HTTP route pattern (or "http"), or OnceConfig.Name for Once.Do.
	Outcome(handler string, outcome Outcome)
	// StoreLatency is called after every store call with the operation
	// (OpClaim, OpRenew, OpComplete, OpFail, OpRelease), its duration, and
	// its error.
	StoreLatency(op Op, d time.Duration, err error)
}

// OutcomeDetails is what a ContextObserver learns about one outcome, beside
// the label that Observer.Outcome gets.
type OutcomeDetails struct {
	// Handler is the label Observer.Outcome receives: the Watermill
	// handler's name, the HTTP route pattern (or "http"), or
	// OnceConfig.Name.
	Handler string
	// Scope is the scope the key was stored under: the Watermill handler's
	// name (Config.Scope), the HTTP route label, or OnceConfig.Name. It
	// never holds a tenant's identity.
	Scope string
	// Key is the key as stored (for Watermill prefix:scope:key), empty when
	// none could be derived. It may carry user data: an observer that
	// exports it should hash it.
	Key string
	// Outcome is what happened.
	Outcome Outcome
	// Attempt is the key's attempt count after the claim (Record.Attempts):
	// the number of this run when the handler ran, the stored count when it
	// did not, and 0 when no record was read (no key, store unavailable).
	Attempt int
	// Replayed is true when the stored result was returned instead of
	// running the handler (OutcomeDuplicate).
	Replayed bool
	// Err is the error reported with the outcome, nil for processed and
	// duplicate.
	Err error
}

// ContextObserver is an Observer that also wants every outcome with the
// context of its message or request (msg.Context() for Watermill, the
// request's context for HTTP, the ctx of Once.Do) and its details, for
// example to put attributes on the span that context carries. When an
// Observer implements it, OutcomeContext is called instead of Outcome, once
// per outcome; StoreLatency is called as for any Observer. Package idemotel
// provides one for OpenTelemetry.
type ContextObserver interface {
	Observer
	// OutcomeContext is called once per delivery or request, instead of
	// Outcome. ctx may be cancelled already; it must not be retained.
	OutcomeContext(ctx context.Context, d OutcomeDetails)
}

// CacheObserver is an Observer that also wants every lookup of the cache of
// COMPLETED records (OnceConfig.CacheTTL), for example to count its hit
// ratio; package idemprom counts them as idempotency_cache_lookups_total.
// It is called only while the cache is on, once per claim, before any
// store call.
type CacheObserver interface {
	Observer
	// CacheLookup is called once per claim with its label (the Watermill
	// handler's name, or OnceConfig.Name for Once.Do and Once.Claim) and
	// whether the cache answered it (hit) or the claim went on to the store.
	CacheLookup(handler string, hit bool)
}

// ReportOutcome tells obs about one outcome: OutcomeContext when obs is a
// ContextObserver, else Outcome(d.Handler, d.Outcome). Adapters built on
// Once.Claim (httpidem, grpcidem, or one of your own) call it where they
// report their outcomes, so that every Observer gets them as it gets the
// middleware's. A nil obs is ignored, and
// so is a nil ctx for a plain Observer; a ContextObserver gets
// context.Background() instead of a nil ctx.
func ReportOutcome(ctx context.Context, obs Observer, d OutcomeDetails) {
	switch o := obs.(type) {
	case nil:
	case ContextObserver:
		if ctx == nil {
			ctx = context.Background()
		}
		o.OutcomeContext(ctx, d)
	default:
		o.Outcome(d.Handler, d.Outcome)
	}
}

type nopObserver struct{}

func (nopObserver) Outcome(string, Outcome)               {}
func (nopObserver) StoreLatency(Op, time.Duration, error) {}
