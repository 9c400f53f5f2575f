package httpidem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

type requestMark struct{}

// contextObserver records what a idempotency.ContextObserver is told.
type contextObserver struct {
	mu      sync.Mutex
	details []idempotency.OutcomeDetails
	marks   []any
	plain   int
}

func (o *contextObserver) Outcome(string, idempotency.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.plain++
}

func (o *contextObserver) StoreLatency(idempotency.Op, time.Duration, error) {}

func (o *contextObserver) OutcomeContext(ctx context.Context, d idempotency.OutcomeDetails) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.details = append(o.details, d)
	o.marks = append(o.marks, ctx.Value(requestMark{}))
}

// A ContextObserver gets each request's outcome with the request's context
// (where otelhttp keeps its span), the stored key, the attempt and the
// replayed flag.
func TestContextObserverGetsRequestDetails(t *testing.T) {
	obs := &contextObserver{}
	m := newMiddleware(t, memstore.New(memstore.Config{}), "p:", func(c *httpidem.Config) { c.Observer = obs })
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

	require.Len(t, obs.details, 4)
	assert.Zero(t, obs.plain)
	assert.Equal(t, []any{0, 1, 2, 3}, obs.marks)
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
		d := obs.details[i]
		assert.Equal(t, w.outcome, d.Outcome, "%d", i)
		assert.Equal(t, w.attempt, d.Attempt, "%s", w.outcome)
		assert.Equal(t, w.replayed, d.Replayed, "%s", w.outcome)
		assert.Equal(t, httpidem.DefaultOutcomeLabel, d.Handler)
		assert.Equal(t, d.Handler, d.Scope)
	}
	assert.True(t, strings.HasPrefix(obs.details[0].Key, "p:"), obs.details[0].Key)
	assert.NotContains(t, obs.details[0].Key, "acme", "the stored key holds the tenant's hash, never the tenant")
	assert.Equal(t, obs.details[0].Key, obs.details[2].Key)
	assert.Empty(t, obs.details[3].Key)
}
