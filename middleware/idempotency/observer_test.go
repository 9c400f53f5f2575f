package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/observertest"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

type ctxKey struct{}

// A ContextObserver gets each outcome once, with the message's context, its
// stored key, attempt and replayed flag, and never the plain Outcome call.
func TestContextObserverGetsDetailsWithMessageContext(t *testing.T) {
	obs := &observertest.ContextRecorder{Mark: ctxKey{}}
	idem, err := idempotency.New(idempotency.Config{Store: memstore.New(memstore.Config{}), Observer: obs, Scope: ordersScope}, watermill.NopLogger{})
	require.NoError(t, err)
	fail := true
	h := idem.Middleware(func(*message.Message) ([]*message.Message, error) {
		if fail {
			fail = false
			return nil, errors.New("boom")
		}
		return nil, nil
	})
	for i := range 3 {
		msg := newMsg("req-1", "p")
		msg.SetContext(context.WithValue(context.Background(), ctxKey{}, i))
		_, _ = h(msg)
	}
	missing := message.NewMessage("", nil)
	missing.SetContext(context.WithValue(context.Background(), ctxKey{}, 3))
	_, _ = h(missing)

	require.Len(t, obs.Details(), 4)
	assert.Zero(t, obs.Plain(), "Outcome is not called for a ContextObserver")
	assert.Equal(t, []any{0, 1, 2, 3}, obs.Marks(), "each outcome carries its message's context")
	want := []struct {
		outcome  idempotency.Outcome
		attempt  int
		replayed bool
		err      bool
	}{
		{idempotency.OutcomeHandlerFailed, 1, false, true},
		{idempotency.OutcomeProcessed, 2, false, false},
		{idempotency.OutcomeDuplicate, 2, true, false},
		{idempotency.OutcomeMissingKey, 0, false, true},
	}
	for i, w := range want {
		d := obs.Details()[i]
		assert.Equal(t, w.outcome, d.Outcome, "outcome %d", i)
		assert.Equal(t, w.attempt, d.Attempt, "attempt of %s", w.outcome)
		assert.Equal(t, w.replayed, d.Replayed, "replayed of %s", w.outcome)
		assert.Equal(t, w.err, d.Err != nil, "error of %s: %v", w.outcome, d.Err)
		if i < 3 {
			assert.Equal(t, "orders", d.Handler)
			assert.Equal(t, "orders", d.Scope)
			assert.Equal(t, "idem:orders:req-1", d.Key)
		}
	}
}

// Once.Do hands its caller's context to a ContextObserver.
func TestContextObserverGetsOnceDoContext(t *testing.T) {
	obs := &observertest.ContextRecorder{Mark: ctxKey{}}
	o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), Observer: obs, Name: "payments"}, nil)
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), ctxKey{}, "call")
	for range 2 {
		_, err := o.Do(ctx, "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
	}
	require.Len(t, obs.Details(), 2)
	assert.Equal(t, []any{"call", "call"}, obs.Marks())
	assert.Equal(t, idempotency.OutcomeDetails{Handler: "payments", Scope: "payments", Key: "k", Outcome: idempotency.OutcomeProcessed, Attempt: 1}, obs.Details()[0])
	assert.Equal(t, idempotency.OutcomeDetails{Handler: "payments", Scope: "payments", Key: "k", Outcome: idempotency.OutcomeDuplicate, Attempt: 1, Replayed: true}, obs.Details()[1])
}

// ReportOutcome calls Outcome on a plain Observer and ignores a nil one.
func TestReportOutcomeOnPlainObserver(t *testing.T) {
	obs := newOutcomes()
	idempotency.ReportOutcome(context.Background(), obs, idempotency.OutcomeDetails{Handler: "h", Outcome: idempotency.OutcomeInProgress})
	assert.Equal(t, 1, obs.get(idempotency.OutcomeInProgress))
	idempotency.ReportOutcome(context.Background(), nil, idempotency.OutcomeDetails{Outcome: idempotency.OutcomeInProgress})
	d := &observertest.ContextRecorder{Mark: ctxKey{}}
	//lint:ignore SA1012 a nil ctx is documented: the observer gets context.Background()
	idempotency.ReportOutcome(nil, d, idempotency.OutcomeDetails{Outcome: idempotency.OutcomeInProgress})
	require.Len(t, d.Details(), 1)
	assert.Nil(t, d.Marks()[0])
}

func ordersScope(*message.Message) string { return "orders" }
