package mysqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// The tests of a COMMIT after CompleteInTx. MySQL has no deferred
// constraint, so nothing the transaction wrote can make its COMMIT fail;
// what fails a COMMIT here is a dropped connection: the consumer reaches
// MariaDB through a fault proxy, which resets its connections (TCP RST)
// after CompleteInTx and before the COMMIT. The COMMIT then never reaches
// the server, which rolls the transaction back when it sees the reset:
// effect and COMPLETED are gone, deterministically, and tx.Commit fails.
// The reset also hits the consumer's other connections (its renewals'), as
// a network fault would; the store sees those as store errors and retries.

// txConsumer is one consumer's database handle and store, on a shared table.
// The first consumer of a test reaches the server through a fault proxy;
// the second directly.
type txConsumer struct {
	db    *sql.DB
	store *mysqlstore.Store
	proxy *testserver.FaultProxy // nil when direct
}

// proxiedConsumer returns a consumer of table whose connections go through
// a fault proxy.
func proxiedConsumer(t *testing.T, table string) *txConsumer {
	t.Helper()
	cfg, err := mysql.ParseDSN(testserver.MySQLDSN())
	require.NoError(t, err)
	proxy := testserver.StartFaultProxy(t, cfg.Addr)
	cfg = cfg.Clone()
	cfg.Addr = proxy.Addr
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return &txConsumer{db: db, store: s, proxy: proxy}
}

// book makes the effect of key in one READ COMMITTED transaction with its
// COMPLETED (CompleteInTx) and commits it. With cutAtCommit, the consumer's
// connections are reset after CompleteInTx succeeded and before the COMMIT,
// which then fails, and the server rolls the transaction back.
func (c *txConsumer) book(ctx context.Context, table, key string, cutAtCommit bool, out ...*message.Message) error {
	tx, err := c.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(table)+" (k) VALUES (?)", key); err != nil {
		return err
	}
	if err := c.store.CompleteInTx(ctx, tx, out...); err != nil {
		return err
	}
	if cutAtCommit {
		c.proxy.ResetAll()
	}
	return tx.Commit()
}

// requireCommitFailed checks that err is the error of a COMMIT whose
// connection was reset: driver.ErrBadConn when go-sql-driver could not
// send it, its invalid connection when the reply could not be read.
func requireCommitFailed(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err, "the first COMMIT fails")
	require.True(t, errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn),
		"on the reset connection: %v", err)
}

// commitSetup is a test's table of effects, its first consumer (through a
// fault proxy) and its second (direct), on one store table.
func commitSetup(t *testing.T) (first, second *txConsumer, effects string, direct *sql.DB) {
	t.Helper()
	direct = testDB(t)
	s, table := newTable(t, direct)
	return proxiedConsumer(t, table), &txConsumer{db: direct, store: s}, effectsTable(t, direct), direct
}

// shared is c as a consumer of sqlstoretest, booking on table.
func (c *txConsumer) shared(table string) sqlstoretest.Consumer {
	return sqlstoretest.Consumer{
		Store: c.store,
		Book: func(ctx context.Context, key string, failCommit bool) error {
			return c.book(ctx, table, key, failCommit)
		},
	}
}

// commitCase is a case of sqlstoretest on commitSetup's consumers and
// effects table.
func commitCase(t *testing.T) sqlstoretest.Commit {
	a, b, fx, direct := commitSetup(t)
	return sqlstoretest.Commit{
		First: a.shared(fx), Second: b.shared(fx),
		Effects:             func(t *testing.T, key string) int { return effectsOf(t, direct, fx, key) },
		RequireCommitFailed: requireCommitFailed,
		ErrAlreadyCompleted: mysqlstore.ErrAlreadyCompleted,
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
// retry's completion says ErrAlreadyCompleted (sqlstoretest). The lost
// answer is the handler's own error after a COMMIT that succeeded: cutting
// the COMMIT's reply through the proxy (TestConnectionCuts does, on a
// one-connection pool) could cut a renewal's reply instead, since the
// renewal that waited for the row answers at the same moment.
func TestLostCommitAnswerWithRetryInside(t *testing.T) {
	sqlstoretest.LostCommitAnswerWithRetryInside(t, commitCase(t))
}

// A transaction that wrote COMPLETED and rolled back leaves the run as it
// was: renewed, and, when the handler then succeeds without another
// transactional completion, completed by the middleware. Before, the run
// stopped renewing and wrote nothing, and the key was left to lapse.
func TestRolledBackCompletionLeavesTheRunRenewed(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	obs := &sqlstoretest.Renewals{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: a.store, LeaseTTL: sqlstoretest.CommitLease, Observer: obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: -1})
	require.NoError(t, err)
	const key = "order-rollback"

	out, err := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := a.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(fx)+" (k) VALUES (?)", key); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		if err := a.store.CompleteInTx(ctx, tx); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		if err := tx.Rollback(); err != nil {
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
	rec, err := b.store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "the successful run is COMPLETED, not left to lapse")
	assert.Zero(t, effectsOf(t, direct, fx, key))
}

// A transaction held open after CompleteInTx for most of a lease: the
// renewals wait for its row lock and cannot tell the lease is kept, so the
// handler's context is cancelled with ErrLeaseLost before the lease can
// lapse, as for a handler whose renewals fail; database/sql rolls the
// transaction back when that context ends, the COMMIT does not happen, and
// the second consumer's copy runs only after the first handler returned.
// Before, the run stopped renewing at CompleteInTx and its context was
// never cancelled.
func TestTransactionHeldOpenPastTheLease(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: a.store, LeaseTTL: sqlstoretest.CommitLease})
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
			tx, err := a.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback() }()
			// Left before the deferred rollback (database/sql also rolls the
			// transaction back as soon as its context ends).
			defer ov.Enter()()
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(fx)+" (k) VALUES (?)", key); err != nil {
				return nil, err
			}
			if err := a.store.CompleteInTx(ctx, tx); err != nil {
				return nil, err
			}
			close(held)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(10 * sqlstoretest.CommitLease):
			}
			commitErr = tx.Commit()
			return nil, commitErr
		})(newMessage(key))
	}()
	select {
	case <-held:
	case <-done:
		t.Fatal("the handler did not reach its COMMIT")
	}
	ranB := sqlstoretest.Contend(t, b.shared(fx), key, ov, done)

	require.ErrorIs(t, cause, idempotency.ErrLeaseLost, "the held transaction's context is cancelled")
	assert.Error(t, commitErr, "the COMMIT under the cancelled context does not happen")
	assert.False(t, ov.Seen(), "the second consumer's handler ran beside the first one")
	assert.EqualValues(t, 1, ranB.Load(), "the second consumer's copy ran, once")
	assert.Equal(t, 1, effectsOf(t, direct, fx, key), "one effect: the second consumer's")
}
