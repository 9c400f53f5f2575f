package idempotency

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Run is one claimed run of a key, as the context of its work carries it
// (RunFromContext): what a store needs to write COMPLETED inside the work's
// own database transaction, so that the effect and COMPLETED commit
// together or not at all (package pgstore's CompleteInTx, which a handler
// calls). Stores use it; handlers rarely need it directly.
type Run struct {
	lease *Lease
	// idem is the Watermill middleware running the handler, whose Config
	// says how produced messages are stored; nil outside it.
	idem *Middleware
	// do: the run is Once.Do's, whose work returns the value to store.
	do bool
}

type runKey struct{}

// RunFromContext returns the run that ctx belongs to: the context of a
// Watermill handler under this middleware (msg.Context()) or of the work of
// Once.Do. It returns false outside such a run, and for the runs of other
// adapters (package httpidem stores the response the handler wrote, which a
// transaction inside the handler cannot know), so that a store's
// transactional completion refuses them instead of storing a wrong result.
func RunFromContext(ctx context.Context) (*Run, bool) {
	r, ok := ctx.Value(runKey{}).(*Run)
	if !ok || r.idem == nil && !r.do {
		return nil, false
	}
	return r, true
}

// Key is the stored key of the run.
func (r *Run) Key() string { return r.lease.dv.key }

// Token is the owner token of the run, which the store's fenced COMPLETED
// write must match.
func (r *Run) Token() string { return r.lease.token }

// Store is the store the run was claimed in: OnceConfig.Store
// as given. A store's transactional completion checks
// it, so that a run claimed in another store (Redis, say) gets an error
// that says so rather than ErrLeaseLost; see ClaimedIn.
func (r *Run) Store() Store { return r.lease.o.cfg.Store }

// ClaimedIn reports whether is accepts the store the run was claimed in:
// Store itself, or a store it wraps, found by following Unwrap()
// idempotency.Store methods (a wrapper that times or counts calls
// implements it to keep transactional completion working).
func (r *Run) ClaimedIn(is func(Store) bool) bool {
	st := r.Store()
	for range 64 { // a bound, in case a wrapper unwraps to itself
		if st == nil {
			return false
		}
		if is(st) {
			return true
		}
		u, ok := st.(interface{ Unwrap() Store })
		if !ok {
			return false
		}
		st = u.Unwrap()
	}
	return false
}

// CompletedTTL is how long the COMPLETED record must be kept.
func (r *Run) CompletedTTL() time.Duration { return r.lease.o.cfg.CompletedTTL }

// Result is the stored result of a Watermill handler that produced out,
// encoded as the middleware stores it (bounded by OnceConfig.MaxOutputSize,
// nothing when output replay is disabled), so that duplicates republish
// the same messages. For a run of Once.Do, whose stored result is the
// work's value itself, it encodes out with the same format and no bound;
// such work passes its value to the store instead.
func (r *Run) Result(out ...*message.Message) []byte {
	if r.idem != nil {
		result, _ := r.idem.encodeResult(out)
		return result
	}
	if len(out) == 0 {
		return nil
	}
	return encodeOutput(out)
}

// CompletedInTransaction tells the run that its work wrote COMPLETED inside
// its own transaction: a store's transactional completion calls it once the
// fenced write succeeded. Until that transaction is known to have committed,
// the run keeps its lease: the renewals go on, and the work's context is
// cancelled with ErrLeaseLost if the lease is lost, as before the write.
// A renewal sent after the write waits for the transaction (the store holds
// the record locked until it ends) and then tells which way it ended:
//
//   - committed: the store answers ErrCompletedByOwner; the lease ends
//     quietly (no cancellation), and the adapter writes no second
//     COMPLETED;
//   - rolled back: the renewal succeeds and the run goes on as if nothing
//     had been written, so that work which retries (Watermill's Retry
//     inside the middleware, a loop in the handler) still holds the key,
//     and a success without another transactional completion is written
//     by the adapter as usual.
//
// When the work returns success before any renewal told, the adapter writes
// nothing: the work must return an error unless the transaction of its last
// transactional completion committed. It may be called once per
// transaction.
func (r *Run) CompletedInTransaction() {
	l := r.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tx != txCommitted {
		l.tx = txPending
	}
	l.txGen++
}
