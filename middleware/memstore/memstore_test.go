package memstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware"
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
		res, err := s.Claim(ctx, k, time.Second, nil)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, k, res.Token, []byte("r"), live*time.Millisecond))
		clock.Advance(time.Millisecond)
		require.LessOrEqual(t, s.Len(), live+1, "records past their TTL must be reclaimed as new keys arrive")
	}
}

func TestClosed(t *testing.T) {
	s := memstore.New(memstore.Config{})
	require.NoError(t, s.Close())
	_, err := s.Claim(context.Background(), "k", time.Second, nil)
	assert.ErrorIs(t, err, memstore.ErrClosed)
	_, err = s.Get(context.Background(), "k")
	assert.ErrorIs(t, err, memstore.ErrClosed)
	assert.ErrorIs(t, s.Complete(context.Background(), "k", "t", nil, time.Second), memstore.ErrClosed)
}

func TestResultIsCopied(t *testing.T) {
	s := memstore.New(memstore.Config{})
	ctx := context.Background()
	res, err := s.Claim(ctx, "k", time.Second, nil)
	require.NoError(t, err)
	out := []byte("abc")
	require.NoError(t, s.Complete(ctx, "k", res.Token, out, time.Minute))
	out[0] = 'X'
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	rec.Result[1] = 'Y'
	again, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("abc"), again.Result, "neither the caller's slice nor a returned one aliases the stored result")
	assert.Equal(t, middleware.StateCompleted, again.State)
}
