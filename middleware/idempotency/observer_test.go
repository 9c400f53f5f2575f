package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

type ctxKey struct{}

// detailed is a ContextObserver that records what it is told.
type detailed struct {
	mu      sync.Mutex
	details []idempotency.OutcomeDetails
	marks   []any // ctx.Value(ctxKey{}) of each outcome
	plain   int   // calls of Outcome, which must not happen
}

func (d *detailed) Outcome(string, idempotency.Outcome) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.plain++
}

func (d *detailed) StoreLatency(idempotency.Op, time.Duration, error) {}

func (d *detailed) OutcomeContext(ctx context.Context, od idempotency.OutcomeDetails) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.details = append(d.details, od)
	d.marks = append(d.marks, ctx.Value(ctxKey{}))
}

// A ContextObserver gets each outcome once, with the message's context, its
// stored key, attempt and replayed flag, and never the plain Outcome call.
func TestContextObserverGetsDetailsWithMessageContext(t *testing.T) {
	obs := &detailed{}
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

	require.Len(t, obs.details, 4)
	assert.Zero(t, obs.plain, "Outcome is not called for a ContextObserver")
	assert.Equal(t, []any{0, 1, 2, 3}, obs.marks, "each outcome carries its message's context")
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
		d := obs.details[i]
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
	obs := &detailed{}
	o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), Observer: obs, Name: "payments"}, nil)
	require.NoError(t, err)
	ctx := context.WithValue(context.Background(), ctxKey{}, "call")
	for range 2 {
		_, err := o.Do(ctx, "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
	}
	require.Len(t, obs.details, 2)
	assert.Equal(t, []any{"call", "call"}, obs.marks)
	assert.Equal(t, idempotency.OutcomeDetails{Handler: "payments", Scope: "payments", Key: "k", Outcome: idempotency.OutcomeProcessed, Attempt: 1}, obs.details[0])
	assert.Equal(t, idempotency.OutcomeDetails{Handler: "payments", Scope: "payments", Key: "k", Outcome: idempotency.OutcomeDuplicate, Attempt: 1, Replayed: true}, obs.details[1])
}

// ReportOutcome calls Outcome on a plain Observer and ignores a nil one.
func TestReportOutcomeOnPlainObserver(t *testing.T) {
	obs := newOutcomes()
	idempotency.ReportOutcome(context.Background(), obs, idempotency.OutcomeDetails{Handler: "h", Outcome: idempotency.OutcomeInProgress})
	assert.Equal(t, 1, obs.get(idempotency.OutcomeInProgress))
	idempotency.ReportOutcome(context.Background(), nil, idempotency.OutcomeDetails{Outcome: idempotency.OutcomeInProgress})
	d := &detailed{}
	//lint:ignore SA1012 a nil ctx is documented: the observer gets context.Background()
	idempotency.ReportOutcome(nil, d, idempotency.OutcomeDetails{Outcome: idempotency.OutcomeInProgress})
	require.Len(t, d.details, 1)
	assert.Nil(t, d.marks[0])
}

func ordersScope(*message.Message) string { return "orders" }
