package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestHungRenewalStillRecordsOutcome: a renewal that hangs is bounded (by
// LeaseTTL/3), and once it ends the outcome is still recorded, so a retry is a
// replay and not a second run.
func TestHungRenewalStillRecordsOutcome(t *testing.T) {
	eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
		inner, prefix := kind.New(t)
		renewing := make(chan struct{})
		var once sync.Once
		store := faultstore.New(inner).On("renew", func(ctx context.Context, c faultstore.Call) error {
			once.Do(func() { close(renewing) })
			return faultstore.Hang(ctx, c)
		})
		api := newPayments()
		h := newMiddleware(t, store, prefix, func(c *config) { c.LeaseTTL = 600 * time.Millisecond })
		handler := h.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-renewing: // return while the renewal hangs
			case <-time.After(30 * time.Second): // a hang guard
				t.Error("no renewal")
			}
			api.ServeHTTP(w, r)
		}))

		first := serve(handler, newRequest(step{keys: key("k1")}))
		require.Equal(t, http.StatusCreated, first.status)
		rec, err := inner.Get(context.Background(), httpidem.StoreKey(prefix, "", "k1"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, "the outcome must be recorded despite the hung renewal")
		again := serve(handler, newRequest(step{keys: key("k1")}))
		requireReplay(t, first, again)
		assert.EqualValues(t, 1, api.runs.Load())
	})
}

// TestCompleteBoundedByStoreTimeout: a Complete call that hangs times out
// after StoreTimeout and is retried within the lease, rather than taking the
// whole lease and leaving the key to expire.
func TestCompleteBoundedByStoreTimeout(t *testing.T) {
	eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
		inner, prefix := kind.New(t)
		store := faultstore.New(inner).On("complete", faultstore.First(1, faultstore.Hang))
		api := newPayments()
		h := newMiddleware(t, store, prefix, func(c *config) {
			c.LeaseTTL = 5 * time.Second
			c.StoreTimeout = 100 * time.Millisecond
		}).Handler(api)

		first := serve(h, newRequest(step{keys: key("k1")}))
		require.Equal(t, http.StatusCreated, first.status)
		assert.EqualValues(t, 2, store.Calls("complete"), "one call timed out, the retry succeeded")
		rec, err := inner.Get(context.Background(), httpidem.StoreKey(prefix, "", "k1"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State)
		requireReplay(t, first, serve(h, newRequest(step{keys: key("k1")})))
		assert.EqualValues(t, 1, api.runs.Load())
	})
}

// TestClaimBoundedByStoreTimeout: a claim that hangs is answered 503 after
// StoreTimeout, even though the client waits.
func TestClaimBoundedByStoreTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner, prefix := storeKinds[0].New(t)
		store := faultstore.New(inner).On("claim", faultstore.Hang)
		api := newPayments()
		h := newMiddleware(t, store, prefix, func(c *config) { c.StoreTimeout = 50 * time.Millisecond }).Handler(api)

		done := make(chan result, 1)
		go func() { done <- serve(h, newRequest(step{keys: key("k1")})) }()
		select {
		case got := <-done:
			requireProblem(t, got, http.StatusServiceUnavailable, storeUnavailable)
		case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
			t.Fatal("a hanging claim held the request")
		}
		assert.Zero(t, api.runs.Load())
	})
}

// TestLeaseLostBeforeStoreExpires: when renewals keep failing, the handler's
// context is cancelled with ErrLeaseLost while the store still holds the
// lease, never after another request could have claimed the key; and the
// key is then FAILED, whatever the handler answers.
func TestLeaseLostBeforeStoreExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := memstore.New(nil)
		lease := 900 * time.Millisecond
		delay := lease / 12
		// The first renewal succeeds at the store but answers late (it
		// times out for the caller), the second reaches the store only
		// after a delay (network latency: the store counts the lease from
		// then), and every later one fails at once.
		store := faultstore.New(inner).On("renew", faultstore.Sequence(
			faultstore.SlowReply(lease/3+delay),
			faultstore.Delay(delay),
			faultstore.Fail(errors.New("scripted: connection reset")),
		))
		type seen struct {
			cause error
			state idempotency.State
		}
		seenc := make(chan seen, 1)
		h := newMiddleware(t, store, "httpidem", func(c *config) { c.LeaseTTL = lease }).Handler(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				<-r.Context().Done()
				rec, err := inner.Get(context.Background(), httpidem.StoreKey("httpidem", "", "k1"))
				if err != nil {
					panic(err)
				}
				seenc <- seen{context.Cause(r.Context()), rec.State}
				w.WriteHeader(http.StatusCreated) // too late: the lease is lost
			}))

		done := make(chan result, 1)
		go func() { done <- serve(h, newRequest(step{keys: key("k1")})) }()
		select {
		case s := <-seenc:
			assert.ErrorIs(t, s.cause, idempotency.ErrLeaseLost)
			assert.Equal(t, idempotency.StateInProgress, s.state, "the handler must be stopped before the store drops its lease")
		case <-time.After(30 * time.Second): // a hang guard
			t.Fatal("the handler's context was not cancelled")
		}
		<-done
		assert.GreaterOrEqual(t, store.Calls("renew"), int64(3))
		rec, err := inner.Get(context.Background(), httpidem.StoreKey("httpidem", "", "k1"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateFailed, rec.State, "an answer given after the lease was lost is not the key's outcome")
	})
}

// TestLeaseStopRacesRenewal: with a lease of a few milliseconds, renewals
// run constantly and race with the handler returning; run with -race. On
// the real clock, not in a synctest bubble: there a renewal in flight and
// the handler's return would meet only when both fall on the same instant. The
// lease is 3 ms on the in-process store; on Redis it is 30 ms, because a
// network claim that takes most of its lease is refused (the owner could
// not keep it), and a loaded machine takes 3 ms for a round trip.
func TestLeaseStopRacesRenewal(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		lease := 3 * time.Millisecond
		if !inprocess.Is(store) {
			lease = 100 * time.Millisecond // a claim slower than 9/10 of it is refused (503): room for a loaded machine
		}
		h := newMiddleware(t, store, prefix, func(c *config) { c.LeaseTTL = lease }).Handler(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-time.After(time.Duration(rand.Int64N(int64(lease * 4 / 3)))):
				case <-r.Context().Done():
				}
				w.WriteHeader(http.StatusCreated)
			}))
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 25 {
					got := serve(h, newRequest(step{keys: key(fmt.Sprintf("k%d-%d", i, j))}))
					assert.Equal(t, http.StatusCreated, got.status)
				}
			}()
		}
		wg.Wait()
	})
}
