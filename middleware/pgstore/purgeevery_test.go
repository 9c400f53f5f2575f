package pgstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// TestPurgeEvery: the loop drains a backlog of expired rows (more than one
// batch) and keeps live ones, returns nil when its context ends, and
// refuses a bad batch or interval at once.
func TestPurgeEvery(t *testing.T) {
	pool := testPool(t)
	s, table := newTable(t, pool)
	ctx := context.Background()
	const short = 50 * time.Millisecond
	for i := range 7 {
		k := "expired:" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, claim(t, s, k, time.Minute, time.Minute), []byte("r"), short))
	}
	live := "live"
	require.NoError(t, s.Complete(ctx, live, claim(t, s, live, time.Minute, time.Minute), []byte("r"), time.Minute))

	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.PurgeEvery(loopCtx, 10*time.Millisecond, 3, nil) }()
	require.Eventually(t, func() bool { return rows(t, pool, table) == 1 }, 10*time.Second, 10*time.Millisecond,
		"7 expired rows purged in batches of 3, the live one kept")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("PurgeEvery did not return after its context ended")
	}

	require.ErrorIs(t, s.PurgeEvery(ctx, time.Second, 0, nil), pgstore.ErrInvalidBatch)
	err := s.PurgeEvery(ctx, 0, 10, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "interval must be positive")
	assert.Equal(t, 1, rows(t, pool, table))
}
