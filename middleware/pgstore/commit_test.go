package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// The tests of a COMMIT after CompleteInTx. What fails a COMMIT here is a
// deferred constraint: the first consumer writes its effect twice, and the
// COMMIT fails on the unique key after CompleteInTx succeeded. Both
// consumers share one store.

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

// commitConsumer is a consumer that books on store and the effects table.
func commitConsumer(pool *pgxpool.Pool, store *pgstore.Store, table string) sqlstoretest.Consumer {
	return sqlstoretest.Consumer{
		Store: store,
		Book: func(ctx context.Context, key string, failCommit bool) error {
			return book(ctx, pool, store, table, key, failCommit)
		},
	}
}

// commitCase is a case of sqlstoretest on a fresh store table and a table of
// deferred effects.
func commitCase(t *testing.T) sqlstoretest.Commit {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	c := commitConsumer(pool, store, table)
	return sqlstoretest.Commit{
		First: c, Second: c,
		Effects:             func(t *testing.T, key string) int { return effectsOf(t, pool, table, key) },
		RequireCommitFailed: requireCommitFailed,
		ErrAlreadyCompleted: pgstore.ErrAlreadyCompleted,
	}
}

// A COMMIT that fails after CompleteInTx, with Retry inside the middleware:
// the retry keeps the key (sqlstoretest).
func TestFailedCommitWithRetryInsideKeepsTheLease(t *testing.T) {
	sqlstoretest.FailedCommitWithRetryInsideKeepsTheLease(t, commitCase(t))
}

// The same with a retry loop in the handler itself (sqlstoretest).
func TestFailedCommitWithHandlerLoopKeepsTheLease(t *testing.T) {
	sqlstoretest.FailedCommitWithHandlerLoopKeepsTheLease(t, commitCase(t))
}

// A lease lost during the retry after a failed COMMIT cancels the
// handler's context with ErrLeaseLost (sqlstoretest).
func TestLeaseLostDuringRetryAfterFailedCommit(t *testing.T) {
	sqlstoretest.LeaseLostDuringRetryAfterFailedCommit(t, commitCase(t))
}

// A completion whose transaction committed ends the lease quietly
// (sqlstoretest).
func TestCommittedCompletionEndsTheLeaseQuietly(t *testing.T) {
	sqlstoretest.CommittedCompletionEndsTheLeaseQuietly(t, commitCase(t))
}

// A COMMIT whose answer was lost, with Retry inside: one effect, and the
// retry's completion says ErrAlreadyCompleted (sqlstoretest).
func TestLostCommitAnswerWithRetryInside(t *testing.T) {
	sqlstoretest.LostCommitAnswerWithRetryInside(t, commitCase(t))
}

// A transaction that wrote COMPLETED and rolled back leaves the run as it
// was: renewed, and, when the handler then succeeds without another
// transactional completion, completed by the middleware. Before, the run
// stopped renewing and wrote nothing, and the key was left to lapse.
func TestRolledBackCompletionLeavesTheRunRenewed(t *testing.T) {
	pool := testPool(t)
	store, _ := newTable(t, pool)
	table := deferredEffects(t, pool)
	obs := &sqlstoretest.Renewals{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease, Observer: obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
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
		before := obs.OK.Load()
		if !sqlstoretest.WaitFor(func() bool { return obs.OK.Load() >= before+2 }, 10*sqlstoretest.CommitLease) {
			return nil, errors.New("the run stopped renewing after its transaction rolled back")
		}
		return []*message.Message{message.NewMessage("receipt-"+key, []byte("done"))}, ctx.Err()
	})(newMessage(key))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.EqualValues(t, 1, obs.Completes.Load(), "the middleware wrote COMPLETED")
	rec, err := store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "the successful run is COMPLETED, not left to lapse")
	assert.Zero(t, effectsOf(t, pool, table, key))
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
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: sqlstoretest.CommitLease})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	const key = "order-held"

	ov := &sqlstoretest.Overlap{}
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
			defer ov.Enter()()
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
			case <-time.After(10 * sqlstoretest.CommitLease):
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
	ranB := sqlstoretest.Contend(t, commitConsumer(pool, store, table), key, ov, done)

	require.ErrorIs(t, cause, idempotency.ErrLeaseLost, "the held transaction's context is cancelled")
	assert.Error(t, commitErr, "the COMMIT under the cancelled context does not happen")
	assert.False(t, ov.Seen(), "the second consumer's handler ran beside the first one")
	assert.EqualValues(t, 1, ranB.Load(), "the second consumer's copy ran, once")
	assert.Equal(t, 1, effectsOf(t, pool, table, key), "one effect: the second consumer's")
}
