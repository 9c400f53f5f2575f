package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
	"github.com/idempotency/watermill-idempotency/middleware/internal/observertest"
)

// TestDoCallerGone: a Do whose context ends while its claim waits on the
// store is counted caller_gone and logged below Error; one that waits out
// StoreTimeout is store_unavailable. Both return ErrStoreUnavailable, and
// the work runs for neither.
func TestDoCallerGone(t *testing.T) {
	store := adaptertest.PartitionedStore(t)
	obs := &observertest.ContextRecorder{}
	logger := watermill.NewCaptureLogger()
	once := func(storeTimeout time.Duration) *idempotency.Once {
		o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger, Observer: obs, StoreTimeout: storeTimeout})
		require.NoError(t, err)
		return o
	}
	work := func(context.Context) ([]byte, error) {
		t.Error("the work ran")
		return nil, nil
	}

	// The caller's deadline ends long before StoreTimeout could.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := once(2*time.Second).Do(ctx, "callergone-"+adaptertest.RandomHex(t), work)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	assert.Empty(t, logger.Captured()[watermill.ErrorLogLevel], "no operator needs to hear of it")

	// A caller without a deadline waits out StoreTimeout.
	_, err = once(200*time.Millisecond).Do(t.Context(), "callergone-"+adaptertest.RandomHex(t), work)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	assert.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1, "store_unavailable is logged at Error")

	var got []idempotency.Outcome
	for _, d := range obs.Details() {
		got = append(got, d.Outcome)
	}
	assert.Equal(t, []idempotency.Outcome{idempotency.OutcomeCallerGone, idempotency.OutcomeStoreUnavailable}, got)
}

// TestDoStoreTimeoutBeforeCallerDeadline: a Do whose claim StoreTimeout cut
// while its caller still waited is store_unavailable, also when the caller's
// deadline passes while the failed claim is released (the release waits on
// the store up to StoreTimeout too).
func TestDoStoreTimeoutBeforeCallerDeadline(t *testing.T) {
	store := adaptertest.PartitionedStore(t)
	obs := &observertest.ContextRecorder{}
	o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs, StoreTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond) // after StoreTimeout, before the release ends
	defer cancel()
	_, err = o.Do(ctx, "storetimeout-"+adaptertest.RandomHex(t), func(context.Context) ([]byte, error) {
		t.Error("the work ran")
		return nil, nil
	})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	var got []idempotency.Outcome
	for _, d := range obs.Details() {
		got = append(got, d.Outcome)
	}
	assert.Equal(t, []idempotency.Outcome{idempotency.OutcomeStoreUnavailable}, got)
}
