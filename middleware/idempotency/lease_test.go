package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// The lease and timer tests below run in a testing/synctest bubble: the
// in-process store and the lease's timers read the bubble's clock, so a
// lease of the default 40 s passes in no real time, and every step happens
// at the instant the protocol says, not when a loaded machine gets to it.

// A subscriber may cancel a message's context while its handler still runs
// (NATS after AckWait, any subscriber on Close). A handler that does not
// watch its context keeps running; its lease must keep being renewed, or the
// redelivered copy would run beside it.
func TestRenewalOutlivesACancelledMessageContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.Config{})
		idem, _ := newIdem(t, testConfig{Store: store, LeaseTTL: idempotency.DefaultLeaseTTL})
		var runs atomic.Int32
		release := make(chan struct{})
		h := idem.Middleware(func(*message.Message) ([]*message.Message, error) {
			runs.Add(1)
			<-release // ignores its context
			return nil, nil
		})
		parent, cancel := context.WithCancel(context.Background())
		first := newMsg("k", "p")
		first.SetContext(parent)
		done := make(chan error, 1)
		go func() { _, err := h(first); done <- err }()
		synctest.Wait()
		require.EqualValues(t, 1, runs.Load())
		cancel()

		deadline := time.Now().Add(4 * idempotency.DefaultLeaseTTL)
		for time.Now().Before(deadline) {
			_, err := h(newMsg("k", "p"))
			require.ErrorIs(t, err, idempotency.ErrInProgress, "the copy must wait while the first still runs")
			time.Sleep(idempotency.DefaultLeaseTTL / 16)
		}
		close(release)
		require.NoError(t, <-done)
		assert.EqualValues(t, 1, runs.Load())
		_, err := h(newMsg("k", "p"))
		require.NoError(t, err, "and the key completed")
	})
}

// A lease so short that renewals fire while the lease is being set up must
// not race (go test -race) nor lose the key.
func TestTinyLeaseIsRaceFree(t *testing.T) {
	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), LeaseTTL: 3 * time.Millisecond})
	for range 20 {
		_, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) {
			time.Sleep(5 * time.Millisecond)
			return nil, nil
		})(newMsg("tiny-"+time.Now().String(), "p"))
		require.NoError(t, err)
	}
	assert.Equal(t, 20, obs.get(idempotency.OutcomeProcessed)+obs.get(idempotency.OutcomeLeaseLost))
}

// An owner cut off from the store must have its handler's context cancelled
// before the store lets another consumer claim the key.
func TestCutOffOwnerIsCancelledBeforeTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := memstore.New(memstore.Config{})
		const lease = 30 * time.Second
		idem, _ := newIdem(t, testConfig{Store: faultstore.New(inner).On("renew", faultstore.Hang), LeaseTTL: lease})
		var cancelledAt atomic.Int64
		started := make(chan struct{})
		msg := newMsg("cut-off", "p")
		key, err := idem.StoreKey(msg)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := idem.Middleware(func(m *message.Message) ([]*message.Message, error) {
				close(started)
				<-m.Context().Done()
				cancelledAt.Store(time.Now().UnixNano())
				return nil, context.Cause(m.Context())
			})(msg)
			done <- err
		}()
		<-started
		claimedAt := time.Now()
		for {
			res, err := inner.Claim(context.Background(), key, claimFor(time.Minute, nil))
			require.NoError(t, err)
			if res.Acquired {
				at := cancelledAt.Load()
				require.NotZero(t, at, "another consumer acquired the key while the cut-off owner's handler still ran")
				// The bubble's clock stands still between steps that follow
				// one another, so the cancellation and the takeover may
				// read the same instant; what matters is that the handler
				// was cancelled (above), and before its lease ran out.
				assert.LessOrEqual(t, at, time.Now().UnixNano())
				assert.Less(t, at, claimedAt.Add(lease).UnixNano(), "cancelled before the lease ran out")
				break
			}
			time.Sleep(lease / 100)
		}
		require.ErrorIs(t, <-done, idempotency.ErrLeaseLost)
	})
}

// A Complete that began inside the lease is bounded by what is left of it,
// not only by StoreTimeout: when the store does not answer in time the
// outcome is complete_failed (COMPLETED could not be written within the
// lease), never a lease_lost reported after the lease ran out.
func TestCompleteIsBoundedByTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 200 * time.Millisecond
		release := make(chan struct{})
		store := faultstore.New(memstore.New(memstore.Config{})).On("complete", faultstore.Hold(release, faultstore.Fail(idempotency.ErrLeaseLost)))
		time.AfterFunc(3*lease, func() { close(release) })
		idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: lease, StoreTimeout: 5 * time.Second})
		_, err := idem.Middleware((&counter{}).handle)(newMsg("slow-complete", "p"))
		require.NoError(t, err, "the effect happened: acked")
		assert.Equal(t, 1, obs.get(idempotency.OutcomeCompleteFailed))
		assert.Zero(t, obs.get(idempotency.OutcomeLeaseLost), "no call outlived the lease to be told it was lost")
	})
}

// The lease's log lines say which message they are about.
func TestRenewalLogNamesTheMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logger := watermill.NewCaptureLogger()
		idem, err := newMiddleware(testConfig{Store: faultstore.New(memstore.New(memstore.Config{})).On("renew", faultstore.Fail(errors.New("connection reset"))),
			LeaseTTL: 60 * time.Millisecond, NackDelay: -1}, logger)
		require.NoError(t, err)
		msg := newMsg("renew-log", "p")
		_, _ = idem.Middleware(func(*message.Message) ([]*message.Message, error) {
			time.Sleep(45 * time.Millisecond) // past the first renewal at lease/3
			return nil, nil
		})(msg)
		var found bool
		for _, m := range logger.Captured()[watermill.InfoLogLevel] {
			if m.Msg == "Lease renewal failed; retrying" {
				found = true
				assert.Equal(t, msg.UUID, m.Fields["message_uuid"])
				assert.NotEmpty(t, m.Fields["idempotency_key"])
			}
		}
		assert.True(t, found, "the failed renewal was logged")
	})
}

// The lease counts from before the claim's round trip, and so does the
// first renewal: after a claim that took 0.6 of the lease, the lease is
// renewed at once, not a third of a lease later, past the point where the
// owner gives it up.
func TestFirstRenewalCountsFromTheClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 300 * time.Millisecond
		store := faultstore.New(memstore.New(memstore.Config{})).On("claim", faultstore.Sleep(lease*6/10))
		idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: lease})
		_, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			select {
			case <-time.After(lease / 2):
				return nil, nil
			case <-msg.Context().Done():
				return nil, context.Cause(msg.Context())
			}
		})(newMsg("slow-claim", "p"))
		require.NoError(t, err, "the handler kept its lease")
		assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
		assert.GreaterOrEqual(t, obs.op("renew"), 1)
	})
}

// A claim that answers after nine tenths of the lease came too late for the
// owner to keep the lease: the key is given back and the message nacked,
// instead of running work that the next owner could overlap.
func TestClaimAnsweredTooLateIsReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 100 * time.Millisecond
		inner := memstore.New(memstore.Config{})
		idem, obs := newIdem(t, testConfig{Store: faultstore.New(inner).On("claim", faultstore.Sleep(lease*95/100)), LeaseTTL: lease})
		h := &counter{}
		msg := newMsg("late-claim", "p")
		_, err := idem.Middleware(h.handle)(msg)
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
		assert.Zero(t, h.runs.Load(), "nothing ran under a lease about to lapse")
		key, err := idem.StoreKey(msg)
		require.NoError(t, err)
		rec, err := inner.Get(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateAbsent, rec.State, "the claim was released")
		assert.Equal(t, 1, obs.get(idempotency.OutcomeStoreUnavailable))
	})
}

// The lease's context is made when the work first looks at it; whenever
// that is, it says what a context made at the claim would say: a lease
// lost before the work looked is cancelled with ErrLeaseLost as its cause,
// one ended by Complete or Fail is cancelled, a cancelled claim's context
// cancels it with the claim's cause, and a child context made from it is
// cancelled with it.
func TestLeaseContextMadeLateSaysTheSame(t *testing.T) {
	claim := func(t *testing.T, store idempotency.Store, ctx context.Context) *idempotency.Lease {
		t.Helper()
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: 30 * time.Second})
		require.NoError(t, err)
		lease, _, err := once.Claim(ctx, "k", nil)
		require.NoError(t, err)
		require.NotNil(t, lease)
		return lease
	}
	t.Run("lost before", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lease := claim(t, faultstore.New(memstore.New(memstore.Config{})).On("renew", faultstore.Hang), context.Background())
			time.Sleep(30 * time.Second) // no renewal succeeded: lost
			ctx := lease.Context()
			require.Error(t, ctx.Err())
			assert.ErrorIs(t, context.Cause(ctx), idempotency.ErrLeaseLost)
			child, cancel := context.WithCancel(ctx)
			defer cancel()
			assert.ErrorIs(t, context.Cause(child), idempotency.ErrLeaseLost)
			lease.Fail()
		})
	})
	t.Run("lost after", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lease := claim(t, faultstore.New(memstore.New(memstore.Config{})).On("renew", faultstore.Hang), context.Background())
			child, cancel := context.WithCancel(lease.Context())
			defer cancel()
			require.NoError(t, child.Err())
			<-child.Done()
			assert.ErrorIs(t, context.Cause(child), idempotency.ErrLeaseLost)
			assert.ErrorIs(t, context.Cause(lease.Context()), idempotency.ErrLeaseLost)
			lease.Fail()
		})
	})
	t.Run("completed before", func(t *testing.T) {
		lease := claim(t, memstore.New(memstore.Config{}), context.Background())
		require.NoError(t, lease.Complete(nil))
		assert.ErrorIs(t, lease.Context().Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(lease.Context()), context.Canceled)
	})
	t.Run("claim cancelled before", func(t *testing.T) {
		errGone := errors.New("subscriber closed")
		parent, cancel := context.WithCancelCause(context.Background())
		lease := claim(t, memstore.New(memstore.Config{}), parent)
		cancel(errGone)
		assert.ErrorIs(t, lease.Context().Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(lease.Context()), errGone)
		lease.Fail()
	})
	t.Run("values and deadline", func(t *testing.T) {
		type key struct{}
		parent, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Hour)
		defer cancel()
		lease := claim(t, memstore.New(memstore.Config{}), parent)
		want, _ := parent.Deadline()
		got, ok := lease.Context().Deadline()
		assert.True(t, ok)
		assert.Equal(t, want, got)
		assert.Equal(t, "v", lease.Context().Value(key{}))
		require.NoError(t, lease.Complete(nil))
	})
}
