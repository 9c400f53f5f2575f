package idempotency_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Once.Do's outcomes on a working store are part of storetest.Run, which
// every store runs; this file covers what needs no store at all.

func newOnce(t *testing.T, cfg idempotency.OnceConfig) (*idempotency.Once, *outcomes) {
	t.Helper()
	obs := newOutcomes()
	cfg.Observer = obs
	cfg.Logger = watermill.NopLogger{}
	o, err := idempotency.NewOnce(cfg)
	require.NoError(t, err)
	return o, obs
}

// A store that cannot be reached runs nothing and says so.
func TestOnceStoreDown(t *testing.T) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: downStore(t)})
	_, err := o.Do(context.Background(), "k", func(context.Context) ([]byte, error) {
		t.Error("the work ran without a claim")
		return nil, nil
	})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeStoreUnavailable))
}

func TestOnceConfigIsValidated(t *testing.T) {
	_, err := idempotency.NewOnce(idempotency.OnceConfig{LeaseTTL: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Store is required")
	assert.Contains(t, err.Error(), "LeaseTTL is -1ns")
}

// With FailOpen, a store that cannot be reached runs the work without
// deduplication, counted as fail_open; a caller that is gone runs nothing.
func TestOnceFailOpen(t *testing.T) {
	o, obs := newOnce(t, idempotency.OnceConfig{Store: downStore(t), FailOpen: true})
	res, err := o.Do(context.Background(), "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
	require.NoError(t, err)
	assert.Equal(t, idempotency.Result{Value: []byte("v"), Outcome: idempotency.OutcomeFailOpen}, res)
	assert.Equal(t, 1, obs.get(idempotency.OutcomeFailOpen))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = o.Do(ctx, "k", func(context.Context) ([]byte, error) {
		t.Error("the work ran for a caller that is gone")
		return nil, nil
	})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
}
