package idempotency_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestOutcomesAreLoggedWithTheirFields checks the structured log of each
// delivery: key, handler, outcome and attempts.
func TestOutcomesAreLoggedWithTheirFields(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	idem, err := idempotency.New(idempotency.Config{Store: memstore.New(memstore.Config{}), NackDelay: -1}, logger)
	require.NoError(t, err)
	h := &counter{}
	h.failFor.Store(1)
	msg := newMsg("req-1", "p")
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	for range 3 {
		_, _ = idem.Middleware(h.handle)(newMsg("req-1", "p"))
	}

	want := []struct {
		level    watermill.LogLevel
		outcome  idempotency.Outcome
		attempts int
	}{
		{watermill.InfoLogLevel, idempotency.OutcomeHandlerFailed, 1},
		{watermill.DebugLogLevel, idempotency.OutcomeProcessed, 2},
		{watermill.DebugLogLevel, idempotency.OutcomeDuplicate, 2},
	}
	captured := logger.Captured()
	var got []watermill.CapturedMessage
	for _, level := range []watermill.LogLevel{watermill.InfoLogLevel, watermill.DebugLogLevel} {
		for _, m := range captured[level] {
			if m.Msg == "Idempotency outcome" {
				got = append(got, m)
			}
		}
	}
	require.Len(t, got, len(want))
	for i, w := range want {
		f := got[i].Fields
		assert.Equal(t, w.level, got[i].Level, "outcome %s", w.outcome)
		assert.Equal(t, string(w.outcome), f["outcome"])
		assert.Equal(t, key, f["idempotency_key"])
		assert.Equal(t, w.attempts, f["attempts"], "outcome %s", w.outcome)
		assert.Contains(t, f, "handler_name")
		assert.Contains(t, f, "message_uuid")
	}
	assert.ErrorIs(t, got[0].Fields["err"].(error), errHandler, "a failure logs its error")
}
