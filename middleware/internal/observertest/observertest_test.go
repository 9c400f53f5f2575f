package observertest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/observertest"
)

type mark struct{}

// TestContextRecorder: outcomes reported to a ContextRecorder are kept in
// order with their contexts' marks; what a test reads is a copy.
func TestContextRecorder(t *testing.T) {
	r := &observertest.ContextRecorder{Mark: mark{}}
	first := idempotency.OutcomeDetails{Handler: "h", Key: "k1", Outcome: idempotency.OutcomeProcessed, Attempt: 1}
	second := idempotency.OutcomeDetails{Handler: "h", Key: "k1", Outcome: idempotency.OutcomeDuplicate, Attempt: 1}
	r.Outcome(context.WithValue(context.Background(), mark{}, "a"), first)
	r.Outcome(context.Background(), second)

	details := r.Details()
	assert.Equal(t, []idempotency.OutcomeDetails{first, second}, details)
	assert.Equal(t, []any{"a", nil}, r.Marks())

	details[0].Key = "changed"
	assert.Equal(t, "k1", r.Details()[0].Key, "a copy")
}
