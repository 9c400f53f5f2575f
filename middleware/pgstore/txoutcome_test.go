package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
)

// renewalWaiting reports whether a statement on the records' table waits
// for a row lock: the run's renewal, blocked by its own open transaction.
func renewalWaiting(t *testing.T, pool *pgxpool.Pool, records string) bool {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'", records).Scan(&n))
	return n > 0
}

// A handler whose transaction committed its effect with COMPLETED, and
// which then returns an error: the key stays COMPLETED (not FAILED over a
// committed effect), and the redelivery is a duplicate.
func TestErrorAfterCommittedCompletion(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	const key = "order-error-after-commit"

	var runs atomic.Int32
	h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if err := book(msg.Context(), pool, store, table, key, false); err != nil {
			return nil, err
		}
		return nil, errors.New("failed after the commit")
	})
	_, err = h(newMessage(key))
	require.Error(t, err)
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	_, err = h(newMessage(key))
	require.NoError(t, err, "the redelivery is a duplicate")
	assert.EqualValues(t, 1, runs.Load())
	assert.Equal(t, 1, effectsOf(t, pool, table, key))
}

// A COMMIT that fails while the run's renewal waits for the row lock its
// own CompleteInTx holds: that renewal then succeeds and tells the run that
// the transaction rolled back. The run keeps its lease past the lease's
// length (its context is not cancelled), and when the handler succeeds the
// middleware writes COMPLETED.
func TestCommitFailsWhileRenewalWaits(t *testing.T) {
	pool := testPool(t)
	store, records := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &sqlstoretest.Renewals{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease, Observer: obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	const key = "order-renewal-waits"

	var commitErr, ctxErr error
	var waited bool
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		for range 2 {
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(table)+" (key) VALUES ($1)", key); err != nil {
				return nil, err
			}
		}
		if err := store.CompleteInTx(ctx, tx); err != nil {
			return nil, err
		}
		waited = sqlstoretest.WaitFor(func() bool { return renewalWaiting(t, pool, records) }, sqlstoretest.CommitLease)
		commitErr = tx.Commit(ctx)
		select {
		case <-time.After(2 * sqlstoretest.CommitLease):
		case <-ctx.Done():
		}
		ctxErr = context.Cause(ctx)
		return nil, ctxErr
	})(newMessage(key))
	require.True(t, waited, "a renewal waited for the transaction's row lock")
	requireCommitFailed(t, commitErr)
	require.NoError(t, ctxErr, "the run kept its lease")
	require.NoError(t, err)
	assert.Zero(t, obs.Lost.Load())
	assert.EqualValues(t, 1, obs.Completes.Load(), "the middleware wrote COMPLETED")
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Zero(t, effectsOf(t, pool, table, key))
}

// A lease lost while the handler's transaction is open (an operator
// deleted the key): the renewal cancels the handler's context, and
// CompleteInTx under that context answers an error matching
// idempotency.ErrLeaseLost, as its doc says, besides context.Canceled.
// The transaction rolls back: no effect.
func TestCompleteInTxAfterLeaseLostSaysLeaseLost(t *testing.T) {
	pool := testPool(t)
	store, records := newTable(t, pool)
	table := deferredEffects(t, pool)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	const key = "order-lost-in-tx"

	var completeErr error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(table)+" (key) VALUES ($1)", key); err != nil {
			return nil, err
		}
		if _, err := pool.Exec(context.Background(), "DELETE FROM "+quoted(records)); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * sqlstoretest.CommitLease):
			return nil, errors.New("the lost lease did not cancel the handler's context")
		}
		completeErr = store.CompleteInTx(ctx, tx)
		if completeErr == nil {
			return nil, tx.Commit(ctx)
		}
		return nil, completeErr
	})(newMessage(key))
	require.Error(t, err)
	assert.ErrorIs(t, completeErr, idempotency.ErrLeaseLost)
	assert.ErrorIs(t, completeErr, context.Canceled)
	assert.Zero(t, effectsOf(t, pool, table, key))
}

// Once.Do's work whose COMMIT fails after CompleteValueInTx, and which
// tries again in a loop for longer than the lease: the run keeps its key,
// so another process's Do of the key is refused (ErrInProgress) all along
// and never runs its work; once the retry committed, that Do gets the
// value back. One effect.
func TestOnceDoFailedCommitKeepsTheLease(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	newOnce := func() *idempotency.Once {
		o, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease})
		require.NoError(t, err)
		return o
	}
	a, b := newOnce(), newOnce()
	const key = "invoice-retry"
	value := []byte("invoice-value")
	complete := func(ctx context.Context, twice bool) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for range map[bool]int{false: 1, true: 2}[twice] {
				if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(table)+" (key) VALUES ($1)", key); err != nil {
					return err
				}
			}
			return store.CompleteValueInTx(ctx, tx, value)
		})
	}

	var firstErr error
	var bRan atomic.Int32
	retrying := make(chan struct{})
	done := make(chan struct{})
	var aErr error
	go func() {
		defer close(done)
		_, aErr = a.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
			firstErr = complete(ctx, true)
			close(retrying)
			select {
			case <-time.After(2 * sqlstoretest.CommitLease):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			return value, complete(ctx, false)
		})
	}()
	<-retrying
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		case <-time.After(20 * time.Millisecond):
		}
		res, err := b.Do(context.Background(), key, func(context.Context) ([]byte, error) {
			bRan.Add(1)
			return nil, errors.New("ran beside the first run")
		})
		if finished {
			require.NoError(t, err)
			assert.Equal(t, idempotency.OutcomeDuplicate, res.Outcome)
			assert.Equal(t, value, res.Value)
			break
		}
		if err != nil {
			require.ErrorIs(t, err, idempotency.ErrInProgress)
		}
	}
	requireCommitFailed(t, firstErr)
	require.NoError(t, aErr)
	assert.Zero(t, bRan.Load(), "the other Do never ran its work")
	assert.Equal(t, 1, effectsOf(t, pool, table, key))
}

// Two transactional completions in one run: the first transaction rolls
// back, the second commits while a renewal waits for its row lock. That
// renewal finds the key completed by the run (the lease ends quietly: the
// handler's context is not cancelled though it goes on past the lease),
// the middleware writes no COMPLETED of its own, and there is one effect.
func TestRolledBackThenCommittedCompletion(t *testing.T) {
	pool := testPool(t)
	store, records := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &sqlstoretest.Renewals{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease, Observer: obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	const key = "order-two-tx"

	var waited bool
	var ctxErr error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		for i := range 2 {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(table)+" (key) VALUES ($1)", key); err != nil {
				return nil, err
			}
			if err := store.CompleteInTx(ctx, tx); err != nil {
				return nil, err
			}
			if i == 0 {
				if err := tx.Rollback(ctx); err != nil {
					return nil, err
				}
				continue
			}
			waited = sqlstoretest.WaitFor(func() bool { return renewalWaiting(t, pool, records) }, sqlstoretest.CommitLease)
			if err := tx.Commit(ctx); err != nil {
				return nil, err
			}
		}
		select {
		case <-time.After(2 * sqlstoretest.CommitLease):
		case <-ctx.Done():
		}
		ctxErr = context.Cause(ctx)
		return nil, nil
	})(newMessage(key))
	require.NoError(t, err)
	require.True(t, waited, "a renewal waited for the second transaction's row lock")
	assert.NoError(t, ctxErr, "the committed run's context is not cancelled")
	assert.EqualValues(t, 1, obs.CompletedByOwner.Load(), "the waiting renewal found the key completed by the run")
	assert.Zero(t, obs.Lost.Load())
	assert.Zero(t, obs.Completes.Load(), "no Complete call: COMPLETED rode in the second transaction")
	assert.Equal(t, 1, effectsOf(t, pool, table, key))
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}
