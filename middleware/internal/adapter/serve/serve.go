// Package serve is the claim-to-answer flow of packages httpidem and
// grpcidem on an [idempotency.Once], written once. What an answer looks
// like on the wire stays in each adapter.
package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// Request is one HTTP request or gRPC call with a key.
type Request struct {
	Once     *idempotency.Once
	FailOpen bool            // the Once's
	Ctx      context.Context // the request's, for the Observer
	Label    string          // the Observer's label
	Key      string          // the stored key
	Attempts int             // the key's attempts, once claimed
}

// Done counts and logs one outcome, through the Once.
func (r *Request) Done(outcome idempotency.Outcome, err error) {
	r.Once.Report(r.Ctx, idempotency.OutcomeDetails{Handler: r.Label, Key: r.Key, Outcome: outcome, Attempt: r.Attempts, Err: err})
}

// Claim claims the key with fingerprint fp and says what to do:
//   - a Lease: run the handler as the key's owner;
//   - OutcomeDuplicate: replay rec.Result, and report it;
//   - OutcomeFailOpen: run the handler unguarded;
//   - any other outcome: refuse with it.
//
// Claim reports every outcome but the first two. A caller gone during the
// claim is reported so and refused as store_unavailable: nothing runs for
// it, even with FailOpen.
func (r *Request) Claim(fp []byte) (_ *idempotency.Lease, rec idempotency.Record, _ idempotency.Outcome) {
	lease, claim, err := r.Once.Claim(r.Ctx, r.Key, fp)
	r.Attempts, rec = claim.Record.Attempts, claim.Record
	var outcome idempotency.Outcome
	switch {
	case err == nil && lease != nil:
		return lease, rec, ""
	case err == nil && len(rec.Fingerprint) > 0 && !bytes.Equal(rec.Fingerprint, fp):
		outcome = idempotency.OutcomeKeyReused
	case err == nil && rec.State == idempotency.StateCompleted:
		return nil, rec, idempotency.OutcomeDuplicate
	case err == nil:
		// Held by another. A FAILED record is claimed unless its fingerprint
		// differs; a store answering otherwise means: retry later.
		outcome = idempotency.OutcomeInProgress
	case errors.Is(err, idempotency.ErrTooManyAttempts), errors.Is(err, idempotency.ErrCorruptRecord):
		outcome = idempotency.OutcomeOf(err)
	case idempotency.OutcomeOf(err) == idempotency.OutcomeCallerGone:
		r.Done(idempotency.OutcomeCallerGone, err)
		return nil, rec, idempotency.OutcomeStoreUnavailable
	case r.FailOpen && r.Ctx.Err() == nil:
		outcome = idempotency.OutcomeFailOpen
	default:
		outcome = idempotency.OutcomeStoreUnavailable
	}
	r.Done(outcome, err)
	return nil, rec, outcome
}

// Run calls handler under the lease's context, as the key's owner. A panic
// fails the key and goes on. Run returns false when the lease was lost
// meanwhile: another request may be running the key, so this answer is not
// the key's; the key is then FAILED and reported. handler returns what it
// answered, for that report ("" says nothing).
func (r *Request) Run(lease *idempotency.Lease, handler func(ctx context.Context) (answered string)) bool {
	ctx := lease.Context()
	var answered string
	adapter.RunHandler(lease, func(err error) { r.Done(idempotency.OutcomeHandlerFailed, err) },
		func() { answered = handler(ctx) })
	cause := context.Cause(ctx)
	if !errors.Is(cause, idempotency.ErrLeaseLost) {
		return true
	}
	if answered != "" {
		answered = " " + answered
	}
	r.Fail(lease, fmt.Errorf("handler answered%s after its lease was lost: %w", answered, cause))
	return false
}

// Fail records FAILED and reports the handler's failure err.
func (r *Request) Fail(lease *idempotency.Lease, err error) {
	lease.Fail()
	r.Done(idempotency.OutcomeHandlerFailed, err)
}

type forwardKeyCtx struct{}

// WithForwardKey returns ctx carrying the forward key of the stored key
// skey under prefix, for the adapters' ForwardKey.
func WithForwardKey(ctx context.Context, prefix, skey string) context.Context {
	return context.WithValue(ctx, forwardKeyCtx{}, adapter.ForwardKey(prefix, skey))
}

// ForwardKey returns the forward key of ctx, if it carries one.
func ForwardKey(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(forwardKeyCtx{}).(string)
	return key, ok
}
