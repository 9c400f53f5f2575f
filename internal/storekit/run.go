package storekit

import (
	"context"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Run is one claimed run of a key, as its work's context carries it: what a
// store needs to write COMPLETED inside the work's own transaction.
type Run struct {
	key, token   string
	completedTTL time.Duration
	stores       []any
	result       func([]*message.Message) []byte
	committed    func()
}

// RunKey is the context key under which a lease's context answers its *Run.
type RunKey struct{}

// NewRun returns a run; stores is the run's store followed by each store it
// unwraps to. Package idempotency calls it.
func NewRun(key, token string, completedTTL time.Duration, stores []any,
	result func([]*message.Message) []byte, committed func()) *Run {
	return &Run{key: key, token: token, completedTTL: completedTTL, stores: stores, result: result, committed: committed}
}

// RunFromContext returns the run of ctx: that of a Watermill handler under
// the middleware or of Once.Do's work. It returns false elsewhere, and for
// other adapters' runs, whose stored result a transaction cannot know.
func RunFromContext(ctx context.Context) (*Run, bool) {
	r, ok := ctx.Value(RunKey{}).(*Run)
	return r, ok
}

// Key is the stored key of the run.
func (r *Run) Key() string { return r.key }

// Token is the run's owner token, which the fenced COMPLETED write must match.
func (r *Run) Token() string { return r.token }

// Store is the store the run was claimed in, as configured.
func (r *Run) Store() any { return r.stores[0] }

// ClaimedIn reports whether is accepts the run's store or a store it wraps
// (through Unwrap() idempotency.Store methods).
func (r *Run) ClaimedIn(is func(any) bool) bool { return slices.ContainsFunc(r.stores, is) }

// CompletedTTL is how long the COMPLETED record must be kept.
func (r *Run) CompletedTTL() time.Duration { return r.completedTTL }

// Result is the stored result of a handler that produced out, encoded as the
// middleware stores it; for Once.Do's work, out encoded with no bound.
func (r *Run) Result(out ...*message.Message) []byte { return r.result(out) }

// CompletedInTransaction tells the run that its work wrote COMPLETED inside
// its own transaction; call it once the fenced write succeeded, once per
// transaction. The lease is renewed until a renewal tells how the
// transaction ended: ErrCompletedByOwner (committed) ends it quietly; a
// renewal that succeeds (rolled back) lets the run go on as if nothing was
// written. docs/GUARANTEES.md has the cases.
func (r *Run) CompletedInTransaction() { r.committed() }
