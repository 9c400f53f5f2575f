package sqlstoretest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// CommitLease is the lease of the cases of a COMMIT after CompleteInTx:
// short, so that a run that stopped renewing loses it within the case.
const CommitLease = 600 * time.Millisecond

// Consumer is one consumer of a commit case: a store on the case's table,
// and how it books a key.
type Consumer struct {
	Store idempotency.Store
	// Book makes the effect of key in one transaction with its COMPLETED
	// (CompleteInTx) and commits it. With failCommit, the COMMIT fails
	// after CompleteInTx succeeded, and nothing the transaction wrote
	// stays.
	Book func(ctx context.Context, key string, failCommit bool) error
}

// Commit is a commit case's setup: two consumers of one store table, and
// the table of their effects.
type Commit struct {
	// First is the consumer whose COMMIT fails; Second is the one whose
	// copy of the key contends with it.
	First, Second Consumer
	// Effects counts key's rows in the effects table.
	Effects func(t *testing.T, key string) int
	// RequireCommitFailed checks that err is the error of a COMMIT that
	// Book made fail.
	RequireCommitFailed func(t *testing.T, err error)
	// ErrAlreadyCompleted is the store's error of a CompleteInTx on a key
	// already COMPLETED under the run's token.
	ErrAlreadyCompleted error
}

// first is the first consumer's middleware, observed by obs (when not nil).
func (c Commit) first(t *testing.T, obs *Renewals) *idempotency.Middleware {
	cfg := idempotency.OnceConfig{Store: c.First.Store, LeaseTTL: CommitLease}
	if obs != nil {
		cfg.Observer = obs
	}
	once, err := idempotency.NewOnce(cfg)
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	return idem
}

// Renewals counts the outcomes of a middleware's renewals, and its Complete
// calls; it is an idempotency.Observer.
type Renewals struct {
	OK, CompletedByOwner, Lost atomic.Int32
	Completes                  atomic.Int32
}

// Outcome ignores outcomes.
func (r *Renewals) Outcome(context.Context, idempotency.OutcomeDetails) {}
func (r *Renewals) CacheLookup(string, bool)                            {}

// StoreLatency counts Complete calls and renewals by their result.
func (r *Renewals) StoreLatency(op string, _ time.Duration, err error) {
	switch {
	case op == "complete":
		r.Completes.Add(1)
	case op != "renew":
	case err == nil:
		r.OK.Add(1)
	case errors.Is(err, idempotency.ErrCompletedByOwner):
		r.CompletedByOwner.Add(1)
	case errors.Is(err, idempotency.ErrLeaseLost):
		r.Lost.Add(1)
	}
}

// Overlap runs handlers of one key and records whether two ever ran at once.
type Overlap struct {
	running atomic.Int32
	seen    atomic.Bool
}

// Enter marks a handler running until the returned func is called.
func (o *Overlap) Enter() func() {
	if o.running.Add(1) > 1 {
		o.seen.Store(true)
	}
	return func() { o.running.Add(-1) }
}

// Seen reports whether two handlers ever ran at once.
func (o *Overlap) Seen() bool { return o.seen.Load() }

// WaitFor polls cond until it holds or within has passed.
func WaitFor(cond func() bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// NewMessage is a message of key, in the requestId metadata the middleware
// reads by default.
func NewMessage(key string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte("pay"))
	m.Metadata.Set("requestId", key)
	return m
}

// Contend runs second's copy of key until the first consumer is done and
// the copy was answered (a duplicate): it is refused while the first one
// holds the key, and must never run beside it. It returns how many times
// the copy's handler ran.
func Contend(t *testing.T, second Consumer, key string, ov *Overlap, firstDone <-chan struct{}) (ranB *atomic.Int32) {
	t.Helper()
	ranB = &atomic.Int32{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: second.Store, LeaseTTL: CommitLease})
	require.NoError(t, err)
	other, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	h := other.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		defer ov.Enter()()
		ranB.Add(1)
		return nil, second.Book(msg.Context(), key, false)
	})
	deadline := time.After(20 * time.Second)
	for done := false; ; {
		select {
		case <-firstDone:
			done = true
		case <-deadline:
			t.Fatal("the second consumer's copy was never answered")
		case <-time.After(20 * time.Millisecond):
		}
		_, err := h(NewMessage(key))
		if done && err == nil {
			return ranB
		}
		if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("the second consumer's copy: %v", err)
		}
	}
}

// RetryBesideSecond runs h on key's message in a goroutine of its own and,
// once its handler says it is retrying (retrying closes), has second's copy
// of the key contend with it (Contend). It returns when h has returned: how
// many times the copy's handler ran, and h's error. A handler that returns
// without retrying fails the test.
func RetryBesideSecond(t *testing.T, second Consumer, h message.HandlerFunc, key string, ov *Overlap, retrying <-chan struct{}) (ranB *atomic.Int32, err error) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err = h(NewMessage(key))
	}()
	select {
	case <-retrying:
	case <-done:
		t.Fatalf("the retry did not run: %v", err)
	}
	ranB = Contend(t, second, key, ov, done)
	<-done
	return ranB, err
}

// retryInside runs key's message through idem over Watermill's Retry (one
// retry, 10 ms later) over a handler inside ov: its first attempt runs
// first, its retry runs retry, and second's copy of the key contends with
// the retry (RetryBesideSecond), whose results it returns.
func (c Commit) retryInside(t *testing.T, idem *idempotency.Middleware, key string, ov *Overlap, first, retry func(ctx context.Context) error) (ranB *atomic.Int32, err error) {
	t.Helper()
	var attempts atomic.Int32
	retrying := make(chan struct{})
	h := idem.Middleware(middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}.Middleware(
		func(msg *message.Message) ([]*message.Message, error) {
			defer ov.Enter()()
			ctx := msg.Context()
			if attempts.Add(1) == 1 {
				return nil, first(ctx)
			}
			close(retrying)
			return nil, retry(ctx)
		}))
	return RetryBesideSecond(t, c.Second, h, key, ov, retrying)
}

// FailedCommitWithRetryInsideKeepsTheLease: a COMMIT that fails after
// CompleteInTx, with Watermill's Retry inside the middleware: the retry
// still holds the key, so a second consumer's copy is refused until the
// retry committed, then answered as a duplicate. Before, renewals stopped
// at CompleteInTx, the lease lapsed during the retry, and the second
// consumer's handler ran beside it.
func FailedCommitWithRetryInsideKeepsTheLease(t *testing.T, c Commit) {
	obs := &Renewals{}
	idem := c.first(t, obs)
	const key = "order-retry"

	ov := &Overlap{}
	var firstErr error
	ranB, aErr := c.retryInside(t, idem, key, ov,
		func(ctx context.Context) error {
			firstErr = c.First.Book(ctx, key, true)
			return firstErr
		},
		func(ctx context.Context) error {
			// The retry outlasts the lease twice over: only renewals keep
			// the key.
			select {
			case <-time.After(2 * CommitLease):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			return c.First.Book(ctx, key, false)
		})

	c.RequireCommitFailed(t, firstErr)
	assert.False(t, ov.Seen(), "the second consumer's handler ran beside the first one's retry")
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	require.NoError(t, aErr, "the retry committed")
	assert.Equal(t, 1, c.Effects(t, key), "the failed COMMIT's effect was rolled back")
	assert.Zero(t, obs.Lost.Load(), "no renewal found the lease lost")
	rec, err := c.Second.Store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// FailedCommitWithHandlerLoopKeepsTheLease is
// FailedCommitWithRetryInsideKeepsTheLease with a retry loop in the handler
// itself.
func FailedCommitWithHandlerLoopKeepsTheLease(t *testing.T, c Commit) {
	idem := c.first(t, nil)
	const key = "order-loop"

	ov := &Overlap{}
	var firstErr error
	retrying := make(chan struct{})
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		defer ov.Enter()()
		ctx := msg.Context()
		var err error
		for attempt := 1; attempt <= 2; attempt++ {
			if attempt == 1 {
				firstErr = c.First.Book(ctx, key, true)
				err = firstErr
				continue
			}
			close(retrying)
			select {
			case <-time.After(2 * CommitLease):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			err = c.First.Book(ctx, key, false)
		}
		return nil, err
	})

	ranB, aErr := RetryBesideSecond(t, c.Second, h, key, ov, retrying)

	c.RequireCommitFailed(t, firstErr)
	assert.False(t, ov.Seen(), "the second consumer's handler ran beside the first one's retry")
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	require.NoError(t, aErr, "the retry committed")
	assert.Equal(t, 1, c.Effects(t, key))
}

// LeaseLostDuringRetryAfterFailedCommit: a lease lost during the retry
// after a failed COMMIT (an operator deleted the key) cancels the handler's
// context with ErrLeaseLost, as it does before any CompleteInTx. Before,
// nothing renewed the lease after CompleteInTx, and the context was never
// cancelled.
func LeaseLostDuringRetryAfterFailedCommit(t *testing.T, c Commit) {
	idem := c.first(t, nil)
	const key = "order-lost"

	var firstErr, cause error
	h := idem.Middleware(middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}.Middleware(
		func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			if firstErr == nil {
				firstErr = c.First.Book(ctx, key, true)
				return nil, firstErr
			}
			if err := c.Second.Store.Delete(context.Background(), "idem::"+key); !assert.NoError(t, err) {
				return nil, err
			}
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(10 * CommitLease):
			}
			return nil, errors.New("gave up")
		}))
	_, err := h(NewMessage(key))
	require.Error(t, err)
	c.RequireCommitFailed(t, firstErr)
	require.ErrorIs(t, cause, idempotency.ErrLeaseLost, "the retry's context is cancelled when its lease is lost")
	assert.Zero(t, c.Effects(t, key))
}

// CommittedCompletionEndsTheLeaseQuietly: a completion whose transaction
// committed ends the lease quietly: the next renewal finds the key
// COMPLETED under the run's own token (ErrCompletedByOwner), and the
// handler's context is not cancelled though it goes on past the lease.
func CommittedCompletionEndsTheLeaseQuietly(t *testing.T, c Commit) {
	obs := &Renewals{}
	idem := c.first(t, obs)
	const key = "order-quiet"

	var ctxErr error
	_, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		if err := c.First.Book(ctx, key, false); err != nil {
			return nil, err
		}
		// Work after the commit, past the lease: a renewal tells the run
		// that its transaction committed.
		if !WaitFor(func() bool { return obs.CompletedByOwner.Load() > 0 }, 10*CommitLease) {
			return nil, errors.New("no renewal found the key completed by its owner")
		}
		time.Sleep(CommitLease)
		ctxErr = ctx.Err()
		return nil, nil
	})(NewMessage(key))
	require.NoError(t, err)
	assert.NoError(t, ctxErr, "the committed run's context is not cancelled")
	assert.Zero(t, obs.Lost.Load(), "no renewal reported a lost lease")
	assert.Equal(t, int32(1), obs.CompletedByOwner.Load(), "the renewals ended at the first that found the key completed")
	assert.Zero(t, obs.Completes.Load(), "COMPLETED rode in the transaction: no Complete call")
	assert.Equal(t, 1, c.Effects(t, key))
	rec, err := c.Second.Store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// LostCommitAnswerWithRetryInside: a COMMIT whose answer was lost (it
// committed; the handler saw an error), with Retry inside: the retry's
// completion says ErrAlreadyCompleted and rolls back, the renewals have
// ended quietly (the key is COMPLETED under the run's token), the retry's
// context is not cancelled, and a second consumer's copy is a duplicate.
// One effect. The lost answer is the handler's own error after a COMMIT
// that succeeded.
func LostCommitAnswerWithRetryInside(t *testing.T, c Commit) {
	const key = "order-lost-answer"
	obs := &Renewals{}
	idem := c.first(t, obs)

	ov := &Overlap{}
	var secondErr, ctxErr error
	ranB, aErr := c.retryInside(t, idem, key, ov,
		func(ctx context.Context) error {
			if err := c.First.Book(ctx, key, false); err != nil {
				return err
			}
			return errors.New("the COMMIT's answer was lost")
		},
		func(ctx context.Context) error {
			select {
			case <-time.After(2 * CommitLease):
			case <-ctx.Done():
			}
			secondErr = c.First.Book(ctx, key, false)
			ctxErr = ctx.Err()
			if errors.Is(secondErr, c.ErrAlreadyCompleted) {
				return nil // the first transaction's effect stands
			}
			return secondErr
		})

	require.NoError(t, aErr)
	require.ErrorIs(t, secondErr, c.ErrAlreadyCompleted)
	assert.NoError(t, ctxErr, "the retry's context is not cancelled")
	assert.False(t, ov.Seen())
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	assert.Zero(t, obs.Lost.Load())
	assert.Equal(t, int32(1), obs.CompletedByOwner.Load(), "a renewal found the key completed by the run")
	assert.Equal(t, 1, c.Effects(t, key))
}
