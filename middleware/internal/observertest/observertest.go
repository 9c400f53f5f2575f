package observertest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// ContextRecorder is an idempotency.Observer that records the details of
// each outcome, with the value its context holds under Mark.
type ContextRecorder struct {
	// Mark is the context key whose value is kept beside each outcome, so
	// that a test can tell which request or message an outcome came with.
	Mark any

	mu      sync.Mutex
	details []idempotency.OutcomeDetails
	marks   []any
}

var _ idempotency.Observer = (*ContextRecorder)(nil)

// Outcome records d and ctx.Value(Mark).
func (r *ContextRecorder) Outcome(ctx context.Context, d idempotency.OutcomeDetails) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.details = append(r.details, d)
	r.marks = append(r.marks, ctx.Value(r.Mark))
}

// StoreLatency records nothing.
func (r *ContextRecorder) StoreLatency(string, time.Duration, error) {}

// CacheLookup records nothing.
func (r *ContextRecorder) CacheLookup(string, bool) {}

// Details are the outcomes Outcome got, in order.
func (r *ContextRecorder) Details() []idempotency.OutcomeDetails {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.details)
}

// Marks are the values under Mark in the contexts of those outcomes, one
// for each, nil where the context had none.
func (r *ContextRecorder) Marks() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.marks)
}
