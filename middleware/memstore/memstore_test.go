package memstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// claim is a claim request with a fresh token, lease and a minute's TTL.
func claim(lease time.Duration) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: lease, TTL: time.Minute}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		clock := newFakeClock()
		s := memstore.New(memstore.Config{Now: clock.Now})
		t.Cleanup(func() { _ = s.Close() })
		return storetest.Subject{Store: s, Advance: clock.Advance}
	})
}

func TestConformanceRealClock(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: memstore.New(memstore.Config{})}
	})
}

func TestExpiredRecordsAreReclaimed(t *testing.T) {
	clock := newFakeClock()
	s := memstore.New(memstore.Config{Now: clock.Now})
	ctx := context.Background()
	const live = 100
	for i := range 10_000 {
		k := "k" + strconv.Itoa(i)
		req := claim(time.Second)
		_, err := s.Claim(ctx, k, req)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, k, req.Token, []byte("r"), live*time.Millisecond))
		clock.Advance(time.Millisecond)
		require.LessOrEqual(t, s.Len(), live+1, "records past their TTL must be reclaimed as new keys arrive")
	}
}

func TestClosed(t *testing.T) {
	s := memstore.New(memstore.Config{})
	require.NoError(t, s.Close())
	_, err := s.Claim(context.Background(), "k", claim(time.Second))
	assert.ErrorIs(t, err, memstore.ErrClosed)
	_, err = s.Get(context.Background(), "k")
	assert.ErrorIs(t, err, memstore.ErrClosed)
	assert.ErrorIs(t, s.Complete(context.Background(), "k", "t", nil, time.Second), memstore.ErrClosed)
}

func TestResultIsCopied(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	req := claim(time.Second)
	_, err := s.Claim(ctx, "k", req)
	require.NoError(t, err)
	out := []byte("abc")
	require.NoError(t, s.Complete(ctx, "k", req.Token, out, time.Minute))
	out[0] = 'X'
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	rec.Result[1] = 'Y'
	again, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("abc"), again.Result, "neither the caller's slice nor a returned one aliases the stored result")
	assert.Equal(t, idempotency.StateCompleted, again.State)
}

// The default clock (no Config.Now) measures leases as intervals from New,
// with time.Since; inside a synctest bubble that is the bubble's fake clock,
// so the default path is driven here without sleeping. See the package doc
// for why no test steps the wall clock itself.
func TestDefaultClockInSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New(memstore.Config{})
		ctx := context.Background()
		req := claim(time.Second)
		res, err := s.Claim(ctx, "k", req)
		require.NoError(t, err)
		require.True(t, res.Acquired)
		assert.WithinDuration(t, time.Now(), res.Record.UpdatedAt, 0, "reported times are the clock's")

		time.Sleep(time.Second / 2)
		require.NoError(t, s.Renew(ctx, "k", req.Token, time.Second))
		time.Sleep(time.Second / 2)
		rec, err := s.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateInProgress, rec.State, "the renewed lease is live past the claim's deadline")

		time.Sleep(time.Second)
		rec, err = s.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateFailed, rec.State, "the lease lapsed")
		assert.WithinDuration(t, time.Now().Add(-time.Second/2), rec.LeaseExpiresAt, 0, "the lapsed deadline is kept")
		assert.ErrorIs(t, s.Complete(ctx, "k", req.Token, nil, time.Minute), idempotency.ErrLeaseLost)

		time.Sleep(time.Minute)
		rec, err = s.Get(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateAbsent, rec.State, "the record expired TTL after the lapsed deadline")
	})
}
