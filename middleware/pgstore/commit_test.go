package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// commitLease is the lease of the tests of a COMMIT after CompleteInTx:
// short, so that a run that stopped renewing loses it within the test.
const commitLease = 600 * time.Millisecond

// deferredEffects creates a table of effects whose unique key is checked at
// COMMIT (DEFERRABLE INITIALLY DEFERRED): a transaction that writes a key
// twice gets through CompleteInTx and fails at its COMMIT. The constraint's
// name (an index's, unique in the schema) is the table's own, so that
// tests on the shared server do not collide.
func deferredEffects(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := uniqueName("pgstore_deferred_")
	_, err := pool.Exec(context.Background(), "CREATE TABLE "+quoted(table)+
		" (id bigserial PRIMARY KEY, key text NOT NULL, CONSTRAINT "+quoted(table+"_one_per_key")+" UNIQUE (key) DEFERRABLE INITIALLY DEFERRED)")
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, pool, table) })
	return table
}

// book makes the effect of key in one transaction with its COMPLETED;
// with twice, the effect is written twice and the COMMIT fails on the
// deferred constraint, after CompleteInTx succeeded.
func book(ctx context.Context, pool *pgxpool.Pool, store *pgstore.Store, table, key string, twice bool, out ...*message.Message) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		n := 1
		if twice {
			n = 2
		}
		for range n {
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(table)+" (key) VALUES ($1)", key); err != nil {
				return err
			}
		}
		return store.CompleteInTx(ctx, tx, out...)
	})
}

// requireCommitFailed checks that err is the COMMIT's unique violation.
func requireCommitFailed(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the first COMMIT fails")
	require.Equal(t, "23505", pgErr.Code, "on the deferred unique constraint: %v", err)
}

// renewals counts the outcomes of a middleware's renewals.
type renewals struct {
	ok, completedByOwner, lost atomic.Int32
	completes                  atomic.Int32
}

func (r *renewals) Outcome(string, idempotency.Outcome) {}

func (r *renewals) StoreLatency(op idempotency.Op, _ time.Duration, err error) {
	switch {
	case op == idempotency.OpComplete:
		r.completes.Add(1)
	case op != idempotency.OpRenew:
	case err == nil:
		r.ok.Add(1)
	case errors.Is(err, idempotency.ErrCompletedByOwner):
		r.completedByOwner.Add(1)
	case errors.Is(err, idempotency.ErrLeaseLost):
		r.lost.Add(1)
	}
}

// overlap runs handlers of one key and records whether two ever ran at once.
type overlap struct {
	running atomic.Int32
	seen    atomic.Bool
}

func (o *overlap) enter() func() {
	if o.running.Add(1) > 1 {
		o.seen.Store(true)
	}
	return func() { o.running.Add(-1) }
}

// contend runs a second consumer's copy of key until the first consumer is
// done and the copy was answered (a duplicate): it is refused while the
// first one holds the key, and must never run beside it.
func contend(t *testing.T, pool *pgxpool.Pool, store *pgstore.Store, table, key string, ov *overlap, firstDone <-chan struct{}) (ranB *atomic.Int32) {
	t.Helper()
	ranB = &atomic.Int32{}
	other, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1}, nil)
	require.NoError(t, err)
	h := other.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		defer ov.enter()()
		ranB.Add(1)
		return nil, book(msg.Context(), pool, store, table, key, false)
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
		_, err := h(newMessage(key))
		if done && err == nil {
			return ranB
		}
		if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("the second consumer's copy: %v", err)
		}
	}
}

// A COMMIT that fails after CompleteInTx, with Watermill's Retry inside the
// middleware: the retry still holds the key, so a second consumer's copy is
// refused until the retry committed, then answered as a duplicate. Before,
// renewals stopped at CompleteInTx, the lease lapsed during the retry, and
// the second consumer's handler ran beside it.
func TestFailedCommitWithRetryInsideKeepsTheLease(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
	require.NoError(t, err)
	const key = "order-retry"

	ov := &overlap{}
	var attempts atomic.Int32
	var firstErr error
	retrying := make(chan struct{})
	h := idem.Middleware(middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}.Middleware(
		func(msg *message.Message) ([]*message.Message, error) {
			defer ov.enter()()
			ctx := msg.Context()
			if attempts.Add(1) == 1 {
				firstErr = book(ctx, pool, store, table, key, true)
				return nil, firstErr
			}
			close(retrying)
			// The retry outlasts the lease twice over: only renewals keep
			// the key.
			select {
			case <-time.After(2 * commitLease):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			return nil, book(ctx, pool, store, table, key, false)
		}))

	done := make(chan struct{})
	var aErr error
	go func() {
		defer close(done)
		_, aErr = h(newMessage(key))
	}()
	select {
	case <-retrying:
	case <-done:
		t.Fatalf("the retry did not run: %v", aErr)
	}
	ranB := contend(t, pool, store, table, key, ov, done)

	requireCommitFailed(t, firstErr)
	assert.False(t, ov.seen.Load(), "the second consumer's handler ran beside the first one's retry")
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	require.NoError(t, aErr, "the retry committed")
	assert.Equal(t, 1, effectsOf(t, pool, table, key))
	assert.Zero(t, obs.lost.Load(), "no renewal found the lease lost")
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// The same with a retry loop in the handler itself.
func TestFailedCommitWithHandlerLoopKeepsTheLease(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1}, nil)
	require.NoError(t, err)
	const key = "order-loop"

	ov := &overlap{}
	var firstErr error
	retrying := make(chan struct{})
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		defer ov.enter()()
		ctx := msg.Context()
		var err error
		for attempt := 1; attempt <= 2; attempt++ {
			if attempt == 1 {
				firstErr = book(ctx, pool, store, table, key, true)
				err = firstErr
				continue
			}
			close(retrying)
			select {
			case <-time.After(2 * commitLease):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			err = book(ctx, pool, store, table, key, false)
		}
		return nil, err
	})

	done := make(chan struct{})
	var aErr error
	go func() {
		defer close(done)
		_, aErr = h(newMessage(key))
	}()
	select {
	case <-retrying:
	case <-done:
		t.Fatalf("the retry did not run: %v", aErr)
	}
	ranB := contend(t, pool, store, table, key, ov, done)

	requireCommitFailed(t, firstErr)
	assert.False(t, ov.seen.Load(), "the second consumer's handler ran beside the first one's retry")
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	require.NoError(t, aErr, "the retry committed")
	assert.Equal(t, 1, effectsOf(t, pool, table, key))
}

// A lease lost during the retry after a failed COMMIT (an operator deleted
// the key) cancels the handler's context with ErrLeaseLost, as it does
// before any CompleteInTx. Before, nothing renewed the lease after
// CompleteInTx, and the context was never cancelled.
func TestLeaseLostDuringRetryAfterFailedCommit(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1}, nil)
	require.NoError(t, err)
	const key = "order-lost"

	var firstErr, cause error
	h := idem.Middleware(middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}.Middleware(
		func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			if firstErr == nil {
				firstErr = book(ctx, pool, store, table, key, true)
				return nil, firstErr
			}
			require.NoError(t, store.Delete(context.Background(), "idem::"+key))
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(10 * commitLease):
			}
			return nil, errors.New("gave up")
		}))
	_, err = h(newMessage(key))
	require.Error(t, err)
	requireCommitFailed(t, firstErr)
	require.ErrorIs(t, cause, idempotency.ErrLeaseLost, "the retry's context is cancelled when its lease is lost")
	assert.Zero(t, effectsOf(t, pool, table, key))
}

// A completion whose transaction committed ends the lease quietly: the next
// renewal finds the key COMPLETED under the run's own token
// (ErrCompletedByOwner), and the handler's context is not cancelled though
// it goes on past the lease.
func TestCommittedCompletionEndsTheLeaseQuietly(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
	require.NoError(t, err)
	const key = "order-quiet"

	var ctxErr error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		if err := book(ctx, pool, store, table, key, false); err != nil {
			return nil, err
		}
		// Work after the commit, past the lease: a renewal tells the run
		// that its transaction committed.
		if !waitFor(func() bool { return obs.completedByOwner.Load() > 0 }, 10*commitLease) {
			return nil, errors.New("no renewal found the key completed by its owner")
		}
		time.Sleep(commitLease)
		ctxErr = ctx.Err()
		return nil, nil
	})(newMessage(key))
	require.NoError(t, err)
	assert.NoError(t, ctxErr, "the committed run's context is not cancelled")
	assert.Zero(t, obs.lost.Load(), "no renewal reported a lost lease")
	assert.Equal(t, int32(1), obs.completedByOwner.Load(), "the renewals ended at the first that found the key completed")
	assert.Zero(t, obs.completes.Load(), "COMPLETED rode in the transaction: no Complete call")
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// A transaction that wrote COMPLETED and rolled back leaves the run as it
// was: renewed, and, when the handler then succeeds without another
// transactional completion, completed by the middleware. Before, the run
// stopped renewing and wrote nothing, and the key was left to lapse.
func TestRolledBackCompletionLeavesTheRunRenewed(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
	require.NoError(t, err)
	const key = "order-rollback"

	out, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := store.CompleteInTx(ctx, tx); err != nil {
			return nil, err
		}
		if err := tx.Rollback(ctx); err != nil {
			return nil, err
		}
		// Two renewals that began after the rollback succeed: the run still
		// holds its lease.
		before := obs.ok.Load()
		if !waitFor(func() bool { return obs.ok.Load() >= before+2 }, 10*commitLease) {
			return nil, errors.New("the run stopped renewing after its transaction rolled back")
		}
		return []*message.Message{message.NewMessage("receipt-"+key, []byte("done"))}, ctx.Err()
	})(newMessage(key))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.EqualValues(t, 1, obs.completes.Load(), "the middleware wrote COMPLETED")
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "the successful run is COMPLETED, not left to lapse")
	assert.Zero(t, effectsOf(t, pool, table, key))
}

// waitFor polls cond until it holds or within has passed.
func waitFor(cond func() bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// A transaction held open after CompleteInTx for most of a lease: the
// renewals wait for it and cannot tell the lease is kept, so the handler's
// context is cancelled with ErrLeaseLost before the lease can lapse, as for
// a handler whose renewals fail; its COMMIT under that context does not
// happen, and the second consumer's copy runs only after the first handler
// returned. Before, the run stopped renewing at CompleteInTx and its
// context was never cancelled.
func TestTransactionHeldOpenPastTheLease(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1}, nil)
	require.NoError(t, err)
	const key = "order-held"

	ov := &overlap{}
	var cause, commitErr error
	held := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			// Left before the rollback releases the row to the other copy.
			defer ov.enter()()
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(table)+" (key) VALUES ($1)", key); err != nil {
				return nil, err
			}
			if err := store.CompleteInTx(ctx, tx); err != nil {
				return nil, err
			}
			close(held)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(10 * commitLease):
			}
			commitErr = tx.Commit(ctx)
			return nil, commitErr
		})(newMessage(key))
	}()
	select {
	case <-held:
	case <-done:
		t.Fatal("the handler did not reach its COMMIT")
	}
	ranB := contend(t, pool, store, table, key, ov, done)

	require.ErrorIs(t, cause, idempotency.ErrLeaseLost, "the held transaction's context is cancelled")
	assert.Error(t, commitErr, "the COMMIT under the cancelled context does not happen")
	assert.False(t, ov.seen.Load(), "the second consumer's handler ran beside the first one")
	assert.EqualValues(t, 1, ranB.Load(), "the second consumer's copy ran, once")
	assert.Equal(t, 1, effectsOf(t, pool, table, key), "one effect: the second consumer's")
}

// A COMMIT whose answer was lost (it committed; the handler saw an error),
// with Retry inside: the retry's completion says ErrAlreadyCompleted and
// rolls back, the renewals have ended quietly (the key is COMPLETED under
// the run's token), the retry's context is not cancelled, and a second
// consumer's copy is a duplicate. One effect.
func TestLostCommitAnswerWithRetryInside(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
	require.NoError(t, err)
	const key = "order-lost-answer"

	ov := &overlap{}
	var attempts atomic.Int32
	var secondErr, ctxErr error
	retrying := make(chan struct{})
	h := idem.Middleware(middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}.Middleware(
		func(msg *message.Message) ([]*message.Message, error) {
			defer ov.enter()()
			ctx := msg.Context()
			if attempts.Add(1) == 1 {
				if err := book(ctx, pool, store, table, key, false); err != nil {
					return nil, err
				}
				return nil, errors.New("the COMMIT's answer was lost")
			}
			close(retrying)
			select {
			case <-time.After(2 * commitLease):
			case <-ctx.Done():
			}
			secondErr = book(ctx, pool, store, table, key, false)
			ctxErr = ctx.Err()
			if errors.Is(secondErr, pgstore.ErrAlreadyCompleted) {
				return nil, nil // the first transaction's effect stands
			}
			return nil, secondErr
		}))

	done := make(chan struct{})
	var aErr error
	go func() {
		defer close(done)
		_, aErr = h(newMessage(key))
	}()
	select {
	case <-retrying:
	case <-done:
		t.Fatalf("the retry did not run: %v", aErr)
	}
	ranB := contend(t, pool, store, table, key, ov, done)

	require.NoError(t, aErr)
	require.ErrorIs(t, secondErr, pgstore.ErrAlreadyCompleted)
	assert.NoError(t, ctxErr, "the retry's context is not cancelled")
	assert.False(t, ov.seen.Load())
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	assert.Zero(t, obs.lost.Load())
	assert.Equal(t, int32(1), obs.completedByOwner.Load(), "a renewal found the key completed by the run")
	assert.Equal(t, 1, effectsOf(t, pool, table, key))
}
