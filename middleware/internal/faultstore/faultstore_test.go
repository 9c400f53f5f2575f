package faultstore_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

var errInjected = errors.New("injected")

// completeOnce claims key and completes it through s under ctx, and
// reports how long the Complete took on the bubble's clock, the state the
// store was left in, and what the caller was told.
func completeOnce(t *testing.T, s *faultstore.Store, ctx context.Context, key string) (time.Duration, idempotency.State, error) {
	t.Helper()
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
	res, err := s.Claim(context.Background(), key, req)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	start := time.Now()
	err = s.Complete(ctx, key, req.Token, []byte("r"), time.Minute)
	took := time.Since(start)
	rec, gerr := s.Get(context.Background(), key)
	require.NoError(t, gerr)
	return took, rec.State, err
}

// TestFaults runs one Complete through each Fault, inside a bubble so that
// waits are exact, and checks what the caller was told, how long it waited
// and whether the store saw the call.
func TestFaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fault    faultstore.Fault
		deadline time.Duration // 0: none
		wantErr  error         // nil: success
		wantWait time.Duration
		want     idempotency.State
	}{
		{"none", nil, 0, nil, 0, idempotency.StateCompleted},
		{"pass", faultstore.Pass, 0, nil, 0, idempotency.StateCompleted},
		{"hang", faultstore.Hang, time.Second, context.DeadlineExceeded, time.Second, idempotency.StateInProgress},
		{"fail", faultstore.Fail(errInjected), 0, errInjected, 0, idempotency.StateInProgress},
		{"lose reply", faultstore.LoseReply(errInjected), 0, errInjected, 0, idempotency.StateCompleted},
		{"sleep", faultstore.Sleep(3 * time.Second), 0, nil, 3 * time.Second, idempotency.StateCompleted},
		// The caller waits it out; memstore then refuses a call whose
		// context has ended.
		{"sleep past the deadline", faultstore.Sleep(3 * time.Second), time.Second, context.DeadlineExceeded, 3 * time.Second, idempotency.StateInProgress},
		{"delay", faultstore.Delay(time.Second), 0, nil, time.Second, idempotency.StateCompleted},
		{"delay past the deadline", faultstore.Delay(3 * time.Second), time.Second, context.DeadlineExceeded, time.Second, idempotency.StateInProgress},
		{"slow reply", faultstore.SlowReply(time.Second), 0, nil, time.Second, idempotency.StateCompleted},
		{"slow reply past the deadline", faultstore.SlowReply(3 * time.Second), time.Second, context.DeadlineExceeded, time.Second, idempotency.StateCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				inner := memstore.New(nil)
				s := faultstore.New(inner).On("complete", tc.fault)
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				took, state, err := completeOnce(t, s, ctx, "k")
				if tc.wantErr == nil {
					assert.NoError(t, err)
				} else {
					assert.ErrorIs(t, err, tc.wantErr)
				}
				assert.Equal(t, tc.wantWait, took, "the bubble's clock")
				assert.Equal(t, tc.want, state)
				assert.EqualValues(t, 1, s.Calls("complete"))
				assert.EqualValues(t, 1, s.Calls("claim"))
			})
		})
	}
}

// TestHold: a held call goes on when it is released, and is never made
// when its caller gives up first.
func TestHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := memstore.New(nil)
		release := make(chan struct{}) // in the bubble, so that waiting on it is durable
		time.AfterFunc(2*time.Second, func() { close(release) })
		s := faultstore.New(inner).On("complete", faultstore.Hold(release, nil))

		short, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		took, state, err := completeOnce(t, s, short, "early")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, time.Second, took)
		assert.Equal(t, idempotency.StateInProgress, state, "the store never saw the call")

		took, state, err = completeOnce(t, s, context.Background(), "held")
		assert.NoError(t, err)
		assert.Equal(t, time.Second, took, "held until the release, a second later")
		assert.Equal(t, idempotency.StateCompleted, state)

		s.On("complete", faultstore.Hold(release, faultstore.Fail(errInjected)))
		took, state, err = completeOnce(t, s, context.Background(), "released")
		assert.ErrorIs(t, err, errInjected, "then decides once released")
		assert.Zero(t, took)
		assert.Equal(t, idempotency.StateInProgress, state)
	})
}

// TestCounting: First and Sequence pick their Fault by the call's number
// for its operation, and every call is counted, failed or passed on.
func TestCounting(t *testing.T) {
	errSecond := errors.New("second")
	inner := memstore.New(nil)
	s := faultstore.New(inner).
		On("renew", faultstore.First(2, faultstore.Fail(errInjected))).
		On("fail", faultstore.Sequence(faultstore.Pass, faultstore.Fail(errSecond), faultstore.Fail(errInjected)))
	ctx := context.Background()
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
	_, err := s.Claim(ctx, "k", req)
	require.NoError(t, err)

	for i, want := range []error{errInjected, errInjected, nil, nil} {
		assert.ErrorIs(t, s.Renew(ctx, "k", req.Token, time.Minute), want, "renew %d", i+1)
	}
	assert.EqualValues(t, 4, s.Calls("renew"))

	assert.NoError(t, s.Fail(ctx, "k", req.Token, time.Minute), "fail 1 passes")
	assert.ErrorIs(t, s.Fail(ctx, "k", req.Token, time.Minute), errSecond)
	for range 2 {
		assert.ErrorIs(t, s.Fail(ctx, "k", req.Token, time.Minute), errInjected, "the last Fault repeats")
	}
	assert.EqualValues(t, 4, s.Calls("fail"))
}

// TestClaimAndRelease: a claim passed on returns the store's result; a
// failed one returns a zero result, whether the store applied it or not;
// Release and the call's key reach the Fault.
func TestClaimAndRelease(t *testing.T) {
	inner := memstore.New(nil)
	var keys []string
	s := faultstore.New(inner).
		On("claim", func(ctx context.Context, c faultstore.Call) error {
			keys = append(keys, c.Key)
			switch c.Key {
			case "refused":
				return errInjected
			case "lost":
				return faultstore.LoseReply(errInjected)(ctx, c)
			}
			return c.Pass(ctx)
		}).
		On("release", faultstore.LoseReply(errInjected))
	ctx := context.Background()
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}

	res, err := s.Claim(ctx, "refused", req)
	assert.ErrorIs(t, err, errInjected)
	assert.Equal(t, idempotency.ClaimResult{}, res)
	rec, err := inner.Get(ctx, "refused")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateAbsent, rec.State)

	res, err = s.Claim(ctx, "lost", req)
	assert.ErrorIs(t, err, errInjected)
	assert.Equal(t, idempotency.ClaimResult{}, res, "no result beside an error")
	rec, err = inner.Get(ctx, "lost")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "applied, its reply lost")

	res, err = s.Claim(ctx, "k", req)
	require.NoError(t, err)
	assert.True(t, res.Acquired)
	assert.Equal(t, req.Token, res.Record.Token)
	assert.Equal(t, []string{"refused", "lost", "k"}, keys)

	assert.ErrorIs(t, s.Release(ctx, "k", req.Token), errInjected)
	rec, err = inner.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateAbsent, rec.State, "the release was applied, its reply lost")
	s.On("release", nil)
	assert.NoError(t, s.Release(ctx, "k", req.Token), "nil: passed on again")
	assert.EqualValues(t, 2, s.Calls("release"))
}

// TestNotInProcess: a wrapped memstore is timed like a network store.
func TestNotInProcess(t *testing.T) {
	inner := memstore.New(nil)
	require.True(t, inprocess.Is(inner))
	assert.False(t, inprocess.Is(faultstore.New(inner)))
}
