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

// The Observer gets each outcome once, with the message's context, its
// stored key and attempt.
func TestObserverGetsDetailsWithMessageContext(t *testing.T) {
	obs := &observertest.ContextRecorder{Mark: ctxKey{}}
	idem, err := newMiddleware(testConfig{Store: memstore.New(memstore.Config{}), Observer: obs, Scope: ordersScope}, watermill.NopLogger{})
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
	assert.Equal(t, []any{0, 1, 2, 3}, obs.Marks(), "each outcome carries its message's context")
	want := []struct {
		outcome idempotency.Outcome
		attempt int
		err     bool
	}{
		{idempotency.OutcomeHandlerFailed, 1, true},
		{idempotency.OutcomeProcessed, 2, false},
		{idempotency.OutcomeDuplicate, 2, false},
		{idempotency.OutcomeMissingKey, 0, true},
	}
	for i, w := range want {
		d := obs.Details()[i]
		assert.Equal(t, w.outcome, d.Outcome, "outcome %d", i)
		assert.Equal(t, w.attempt, d.Attempt, "attempt of %s", w.outcome)
		assert.Equal(t, w.err, d.Err != nil, "error of %s: %v", w.outcome, d.Err)
		if i < 3 {
			assert.Equal(t, "orders", d.Handler)
			assert.Equal(t, "idem:orders:req-1", d.Key)
		}
	}
}

// Once.Do hands its caller's context to the Observer, labelled "once".
func TestObserverGetsOnceDoContext(t *testing.T) {
	obs := &observertest.ContextRecorder{Mark: ctxKey{}}
	o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), Observer: obs})
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), ctxKey{}, "call")
	for range 2 {
		_, err := o.Do(ctx, "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
	}
	require.Len(t, obs.Details(), 2)
	assert.Equal(t, []any{"call", "call"}, obs.Marks())
	assert.Equal(t, idempotency.OutcomeDetails{Handler: "once", Key: "k", Outcome: idempotency.OutcomeProcessed, Attempt: 1}, obs.Details()[0])
	assert.Equal(t, idempotency.OutcomeDetails{Handler: "once", Key: "k", Outcome: idempotency.OutcomeDuplicate, Attempt: 1}, obs.Details()[1])
}

// Once.Report counts an adapter's outcome with the Observer and logs it:
// a client's missing key at Debug, a store that is down at Error.
func TestReportCountsAndLogs(t *testing.T) {
	obs := &observertest.ContextRecorder{Mark: ctxKey{}}
	logger := watermill.NewCaptureLogger()
	o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), Observer: obs, Logger: logger})
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), ctxKey{}, "req")
	missing := idempotency.OutcomeDetails{Handler: "POST /pay", Outcome: idempotency.OutcomeMissingKey}
	down := idempotency.OutcomeDetails{Handler: "POST /pay", Key: "k", Outcome: idempotency.OutcomeStoreUnavailable, Err: idempotency.ErrStoreUnavailable}
	o.Report(ctx, missing)
	o.Report(ctx, down)
	assert.Equal(t, []idempotency.OutcomeDetails{missing, down}, obs.Details())
	assert.Equal(t, []any{"req", "req"}, obs.Marks())
	assert.Len(t, logger.Captured()[watermill.DebugLogLevel], 1, "the client's mistake")
	assert.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1, "the operator's concern")
}

// OutcomeOf names the outcome of every error of Claim and Complete.
func TestOutcomeOf(t *testing.T) {
	for err, want := range map[error]idempotency.Outcome{
		nil:                                 idempotency.OutcomeProcessed,
		idempotency.ErrMissingKey:           idempotency.OutcomeMissingKey,
		idempotency.ErrCorruptRecord:        idempotency.OutcomeCorruptRecord,
		idempotency.ErrTooManyAttempts:      idempotency.OutcomeTooManyAttempts,
		idempotency.ErrKeyReused:            idempotency.OutcomeKeyReused,
		idempotency.ErrInProgress:           idempotency.OutcomeInProgress,
		idempotency.ErrLeaseLost:            idempotency.OutcomeLeaseLost,
		idempotency.ErrStoreUnavailable:     idempotency.OutcomeStoreUnavailable,
		errors.New("COMPLETED not written"): idempotency.OutcomeCompleteFailed,
	} {
		assert.Equal(t, want, idempotency.OutcomeOf(err), "%v", err)
		assert.Equal(t, string(want), want.String())
	}
}

func ordersScope(*message.Message) string { return "orders" }
