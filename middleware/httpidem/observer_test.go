package httpidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/observertest"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// requestMark is the context key under which each request carries its number.
type requestMark struct{}

// A ContextObserver gets each request's outcome with the request's context
// (where otelhttp keeps its span), the stored key, the attempt and the
// replayed flag.
func TestContextObserverGetsRequestDetails(t *testing.T) {
	obs := &observertest.ContextRecorder{Mark: requestMark{}}
	m := newMiddleware(t, memstore.New(nil), "p", func(c *config) { c.Observer = obs })
	status := http.StatusOK
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	send := func(mark int, key string) {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set("X-Tenant", "acme")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		req = req.WithContext(context.WithValue(req.Context(), requestMark{}, mark))
		serve(h, req)
	}
	status = http.StatusInternalServerError
	send(0, "k1")
	status = http.StatusOK
	send(1, "k1")
	send(2, "k1")
	send(3, "")

	details := obs.Details()
	require.Len(t, details, 4)
	assert.Equal(t, []any{0, 1, 2, 3}, obs.Marks())
	want := []struct {
		outcome  idempotency.Outcome
		attempt  int
		replayed bool
	}{
		{idempotency.OutcomeHandlerFailed, 1, false},
		{idempotency.OutcomeProcessed, 2, false},
		{idempotency.OutcomeDuplicate, 2, true},
		{idempotency.OutcomeMissingKey, 0, false},
	}
	for i, w := range want {
		d := details[i]
		assert.Equal(t, w.outcome, d.Outcome, "%d", i)
		assert.Equal(t, w.attempt, d.Attempt, "%s", w.outcome)
		assert.Equal(t, w.replayed, d.Outcome == idempotency.OutcomeDuplicate, "%s", w.outcome)
		assert.Equal(t, "http", d.Handler)
	}
	assert.True(t, strings.HasPrefix(details[0].Key, "p:"), details[0].Key)
	assert.NotContains(t, details[0].Key, "acme", "the stored key holds the tenant's hash, never the tenant")
	assert.Equal(t, details[0].Key, details[2].Key)
	assert.Empty(t, details[3].Key)
}
