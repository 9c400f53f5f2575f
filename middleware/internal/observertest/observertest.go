package observertest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// ContextRecorder is an idempotency.ContextObserver that records what it is
// told: the details of each outcome, with the value its context holds under
// Mark, and how often the plain Outcome was called, which the middleware
// must never do for a ContextObserver.
type ContextRecorder struct {
	// Mark is the context key whose value is kept beside each outcome, so
	// that a test can tell which request or message an outcome came with.
	Mark any

	mu      sync.Mutex
	details []idempotency.OutcomeDetails
	marks   []any
	plain   int
}

var _ idempotency.ContextObserver = (*ContextRecorder)(nil)

// Outcome counts the call: see Plain.
func (r *ContextRecorder) Outcome(string, idempotency.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plain++
}

// StoreLatency records nothing.
func (r *ContextRecorder) StoreLatency(idempotency.Op, time.Duration, error) {}

// OutcomeContext records d and ctx.Value(Mark).
func (r *ContextRecorder) OutcomeContext(ctx context.Context, d idempotency.OutcomeDetails) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.details = append(r.details, d)
	r.marks = append(r.marks, ctx.Value(r.Mark))
}

// Details are the outcomes OutcomeContext got, in order.
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

// Plain is how many times Outcome was called.
func (r *ContextRecorder) Plain() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.plain
}
