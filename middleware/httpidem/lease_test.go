package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// hangingStore hangs the calls it is told to until their context ends, as
// a store behind a network partition does, and passes the others on.
type hangingStore struct {
	idempotency.Store
	hangClaims    bool
	hangRenews    bool
	hangCompletes atomic.Int64 // how many Complete calls still hang
	renewing      chan struct{}
	renewOnce     sync.Once
	completes     atomic.Int64
}

func (s *hangingStore) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if s.hangClaims {
		<-ctx.Done()
		return idempotency.ClaimResult{}, fmt.Errorf("hanging: claim: %w", ctx.Err())
	}
	return s.Store.Claim(ctx, key, req)
}

func (s *hangingStore) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	if s.hangRenews {
		s.renewOnce.Do(func() { close(s.renewing) })
		<-ctx.Done()
		return fmt.Errorf("hanging: renew: %w", ctx.Err())
	}
	return s.Store.Renew(ctx, key, token, lease)
}

func (s *hangingStore) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	s.completes.Add(1)
	if s.hangCompletes.Add(-1) >= 0 {
		<-ctx.Done()
		return fmt.Errorf("hanging: complete: %w", ctx.Err())
	}
	return s.Store.Complete(ctx, key, token, result, ttl)
}

// TestHungRenewalStillRecordsOutcome: a renewal that hangs is bounded (by
// LeaseTTL/3), and once it ends the outcome is still recorded, so a retry is a
// replay and not a second run.
func TestHungRenewalStillRecordsOutcome(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		inner, prefix := kind.New(t)
		store := &hangingStore{Store: inner, hangRenews: true, renewing: make(chan struct{})}
		api := newPayments()
		h := newMiddleware(t, store, prefix, func(c *httpidem.Config) { c.LeaseTTL = 600 * time.Millisecond })
		handler := h.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-store.renewing: // return while the renewal hangs
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
	eachStore(t, func(t *testing.T, kind storeKind) {
		inner, prefix := kind.New(t)
		store := &hangingStore{Store: inner}
		store.hangCompletes.Store(1)
		api := newPayments()
		h := newMiddleware(t, store, prefix, func(c *httpidem.Config) {
			c.LeaseTTL = 5 * time.Second
			c.StoreTimeout = 100 * time.Millisecond
		}).Handler(api)

		first := serve(h, newRequest(step{keys: key("k1")}))
		require.Equal(t, http.StatusCreated, first.status)
		assert.EqualValues(t, 2, store.completes.Load(), "one call timed out, the retry succeeded")
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
	inner, prefix := storeKinds[0].New(t)
	store := &hangingStore{Store: inner, hangClaims: true}
	api := newPayments()
	h := newMiddleware(t, store, prefix, func(c *httpidem.Config) { c.StoreTimeout = 50 * time.Millisecond }).Handler(api)

	done := make(chan result, 1)
	go func() { done <- serve(h, newRequest(step{keys: key("k1")})) }()
	select {
	case got := <-done:
		requireProblem(t, got, http.StatusServiceUnavailable, httpidem.ProblemStoreUnavailable)
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("a hanging claim held the request")
	}
	assert.Zero(t, api.runs.Load())
}

// scriptedRenewStore makes the first renewal succeed at the store but
// answer late (it times out for the caller), the second reach the store only
// after a delay (network latency: the store counts the lease from then), and
// every later one fail at once.
type scriptedRenewStore struct {
	idempotency.Store
	renews atomic.Int64
	delay  time.Duration
}

func (s *scriptedRenewStore) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	switch s.renews.Add(1) {
	case 1:
		if err := s.Store.Renew(ctx, key, token, lease); err != nil {
			return err
		}
		select { // the answer is slow
		case <-time.After(lease/3 + s.delay):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	case 2:
		select { // the request is slow
		case <-time.After(s.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		return s.Store.Renew(ctx, key, token, lease)
	default:
		return errors.New("scripted: connection reset")
	}
}

// TestLeaseLostBeforeStoreExpires: when renewals keep failing, the handler's
// context is cancelled with ErrLeaseLost while the store still holds the
// lease, never after another request could have claimed the key; and the
// key is then FAILED, whatever the handler answers.
func TestLeaseLostBeforeStoreExpires(t *testing.T) {
	inner := memstore.New(memstore.Config{})
	t.Cleanup(func() { _ = inner.Close() })
	lease := 900 * time.Millisecond
	store := &scriptedRenewStore{Store: inner, delay: lease / 12}
	type seen struct {
		cause error
		state idempotency.State
	}
	seenc := make(chan seen, 1)
	h := newMiddleware(t, store, httpidem.DefaultKeyPrefix, func(c *httpidem.Config) { c.LeaseTTL = lease }).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
			rec, err := inner.Get(context.Background(), httpidem.StoreKey(httpidem.DefaultKeyPrefix, "", "k1"))
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
	assert.GreaterOrEqual(t, store.renews.Load(), int64(3))
	rec, err := inner.Get(context.Background(), httpidem.StoreKey(httpidem.DefaultKeyPrefix, "", "k1"))
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "an answer given after the lease was lost is not the key's outcome")
}

// TestLeaseStopRacesRenewal: with a lease of a few milliseconds, renewals
// run constantly and race with the handler returning; run with -race. The
// lease is 3 ms on the in-process store; on Redis it is 30 ms, because a
// network claim that takes most of its lease is refused (the owner could
// not keep it), and a loaded machine takes 3 ms for a round trip.
func TestLeaseStopRacesRenewal(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		lease := 3 * time.Millisecond
		if !inprocess.Is(store) {
			lease = 30 * time.Millisecond
		}
		h := newMiddleware(t, store, prefix, func(c *httpidem.Config) { c.LeaseTTL = lease }).Handler(
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
