package memstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
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
	return idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: time.Minute}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		clock := newFakeClock()
		s := memstore.New(clock.Now)
		return storetest.Subject{Store: s, Advance: clock.Advance}
	})
}

func TestConformanceRealClock(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: memstore.New(nil)}
	})
}

// Tokens of any length are told apart by their last byte, and a released
// record keeps no token.
func TestTokensOfAnyLength(t *testing.T) {
	for _, n := range []int{1, 31, 32, 33, 200} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			s := memstore.New(nil)
			ctx := context.Background()
			token := strings.Repeat("t", n-1) + "0"
			near := strings.Repeat("t", n-1) + "1" // differs in the last byte only
			fp := []byte("fingerprint")
			req := idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute, Fingerprint: fp}

			res, err := s.Claim(ctx, "k", req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			rec, err := s.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, token, rec.Token)
			assert.Equal(t, fp, rec.Fingerprint)

			res, err = s.Claim(ctx, "k", idempotency.ClaimRequest{Token: near, Lease: time.Minute, TTL: time.Minute})
			require.NoError(t, err)
			assert.False(t, res.Acquired, "a token that differs in its last byte does not hold the key")
			res, err = s.Claim(ctx, "k", req)
			require.NoError(t, err)
			assert.True(t, res.Acquired, "the owner's resent claim")
			assert.Equal(t, 1, res.Record.Attempts)

			require.ErrorIs(t, s.Fail(ctx, "k", near, time.Minute), idempotency.ErrLeaseLost)
			require.NoError(t, s.Fail(ctx, "k", token, time.Minute))
			require.NoError(t, s.Fail(ctx, "k", token, time.Minute), "a resent Fail")
			require.ErrorIs(t, s.Fail(ctx, "k", near, time.Minute), idempotency.ErrLeaseLost)

			// The next attempt, under a token of another length.
			second := idempotency.ClaimRequest{Token: token + "-second", Lease: time.Minute, TTL: time.Minute}
			res, err = s.Claim(ctx, "k", second)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			assert.Equal(t, 2, res.Record.Attempts)
			assert.Equal(t, fp, res.Record.Fingerprint, "the fingerprint is kept")
			require.NoError(t, s.Release(ctx, "k", second.Token))
			require.ErrorIs(t, s.Fail(ctx, "k", token, time.Minute), idempotency.ErrLeaseLost, "a released record keeps no token")
			require.ErrorIs(t, s.Fail(ctx, "k", second.Token, time.Minute), idempotency.ErrLeaseLost, "a released record keeps no token")

			res, err = s.Claim(ctx, "k", req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			require.NoError(t, s.Complete(ctx, "k", token, []byte("result"), time.Minute))
			require.NoError(t, s.Complete(ctx, "k", token, []byte("other"), time.Minute), "a resent Complete")
			require.ErrorIs(t, s.Complete(ctx, "k", near, []byte("other"), time.Minute), idempotency.ErrLeaseLost)
			rec, err = s.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateCompleted, rec.State)
			assert.Equal(t, []byte("result"), rec.Result)
			assert.Equal(t, fp, rec.Fingerprint)
			assert.Equal(t, 2, rec.Attempts)
			assert.Empty(t, rec.Token)
		})
	}
}

func TestResultIsCopied(t *testing.T) {
	s := memstore.New(nil)
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

// The default clock (no Config.Now) is time.Now; inside a synctest bubble
// that is the bubble's fake clock, so the default path is driven here
// without sleeping.
func TestDefaultClockInSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New(nil)
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

// Records expire exactly at their expiry, whatever their TTLs: renewals
// that move an expiry later or earlier, and a clock that sometimes steps
// back. The model is the expiry of every key, and Len counts the records
// that have not expired.
func TestReclaimedAtExpiry(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	move := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(d)
	}
	s := memstore.New(clock)
	ctx := context.Background()
	expiry := map[string]time.Time{}
	check := func(step int) {
		at := clock()
		want := 0
		for k, exp := range expiry {
			if at.Before(exp) {
				want++
			} else {
				delete(expiry, k)
			}
		}
		require.Equal(t, want, s.Len(), "step %d", step)
	}
	for i := range 3000 {
		k := "k" + strconv.Itoa(i)
		switch i % 7 {
		case 0, 1:
			// A renewal moves the expiry later or, with a shorter lease,
			// earlier.
			lease := 500 * time.Millisecond
			if i%7 == 1 {
				lease = 10 * time.Millisecond
			}
			req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: 100 * time.Millisecond, TTL: 300 * time.Millisecond}
			_, err := s.Claim(ctx, k, req)
			require.NoError(t, err)
			require.NoError(t, s.Renew(ctx, k, req.Token, lease))
			expiry[k] = clock().Add(lease + req.TTL)
		default:
			req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Second, TTL: time.Hour}
			_, err := s.Claim(ctx, k, req)
			require.NoError(t, err)
			ttl := time.Duration(1+i%20) * 100 * time.Millisecond // 20 TTLs
			require.NoError(t, s.Complete(ctx, k, req.Token, nil, ttl))
			expiry[k] = clock().Add(ttl)
		}
		if i%50 == 49 {
			move(-30 * time.Millisecond) // a step back
		} else {
			move(10 * time.Millisecond)
		}
		check(i)
	}
	for i := range 40 {
		move(100 * time.Millisecond)
		check(3000 + i)
	}
	require.Equal(t, 0, s.Len())
}

// TestLongTTLsAfterALongUptime: on a clock 150 years past the store's
// start, a lease and TTL of MaxTTL (and "forever") still hold the key:
// deadlines never overflow into the past.
func TestLongTTLsAfterALongUptime(t *testing.T) {
	clock := newFakeClock()
	s := memstore.New(clock.Now)
	ctx := context.Background()
	clock.Advance(150 * 365 * 24 * time.Hour)
	for _, d := range []time.Duration{idempotency.MaxTTL, time.Duration(1<<63 - 1)} {
		key := "k" + d.String()
		req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: d, TTL: d}
		res, err := s.Claim(ctx, key, req)
		require.NoError(t, err)
		require.True(t, res.Acquired)
		clock.Advance(time.Hour)
		res, err = s.Claim(ctx, key, claim(time.Second))
		require.NoError(t, err)
		assert.False(t, res.Acquired, "lease %v: a live lease is not claimable", d)
		require.NoError(t, s.Renew(ctx, key, req.Token, d))
		require.NoError(t, s.Complete(ctx, key, req.Token, []byte("r"), d))
		clock.Advance(time.Hour)
		rec, err := s.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, "completed for %v", d)
	}
}
