package mysqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
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

// commitLease is the lease of the tests of a COMMIT after CompleteInTx:
// short, so that a run that stopped renewing loses it within the test.
const commitLease = 600 * time.Millisecond

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
func contend(t *testing.T, second *txConsumer, table, key string, ov *overlap, firstDone <-chan struct{}) (ranB *atomic.Int32) {
	t.Helper()
	ranB = &atomic.Int32{}
	other, err := idempotency.New(idempotency.Config{Store: second.store, LeaseTTL: commitLease, NackDelay: -1}, nil)
	require.NoError(t, err)
	h := other.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		defer ov.enter()()
		ranB.Add(1)
		return nil, second.book(msg.Context(), table, key, false)
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

// commitSetup is a test's table of effects, its first consumer (through a
// fault proxy) and its second (direct), on one store table.
func commitSetup(t *testing.T) (first, second *txConsumer, effects string, direct *sql.DB) {
	t.Helper()
	direct = testDB(t)
	s, table := newTable(t, direct)
	return proxiedConsumer(t, table), &txConsumer{db: direct, store: s}, effectsTable(t, direct), direct
}

// A COMMIT that fails after CompleteInTx, with Watermill's Retry inside the
// middleware: the retry still holds the key, so a second consumer's copy is
// refused until the retry committed, then answered as a duplicate. Before,
// renewals stopped at CompleteInTx, the lease lapsed during the retry, and
// the second consumer's handler ran beside it.
func TestFailedCommitWithRetryInsideKeepsTheLease(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
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
				firstErr = a.book(ctx, fx, key, true)
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
			return nil, a.book(ctx, fx, key, false)
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
	ranB := contend(t, b, fx, key, ov, done)

	requireCommitFailed(t, firstErr)
	assert.False(t, ov.seen.Load(), "the second consumer's handler ran beside the first one's retry")
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	require.NoError(t, aErr, "the retry committed")
	assert.Equal(t, 1, effectsOf(t, direct, fx, key), "the failed COMMIT's effect was rolled back")
	assert.Zero(t, obs.lost.Load(), "no renewal found the lease lost")
	rec, err := b.store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// The same with a retry loop in the handler itself.
func TestFailedCommitWithHandlerLoopKeepsTheLease(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1}, nil)
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
				firstErr = a.book(ctx, fx, key, true)
				err = firstErr
				continue
			}
			close(retrying)
			select {
			case <-time.After(2 * commitLease):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			err = a.book(ctx, fx, key, false)
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
	ranB := contend(t, b, fx, key, ov, done)

	requireCommitFailed(t, firstErr)
	assert.False(t, ov.seen.Load(), "the second consumer's handler ran beside the first one's retry")
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	require.NoError(t, aErr, "the retry committed")
	assert.Equal(t, 1, effectsOf(t, direct, fx, key))
}

// A lease lost during the retry after a failed COMMIT (an operator deleted
// the key) cancels the handler's context with ErrLeaseLost, as it does
// before any CompleteInTx. Before, nothing renewed the lease after
// CompleteInTx, and the context was never cancelled.
func TestLeaseLostDuringRetryAfterFailedCommit(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1}, nil)
	require.NoError(t, err)
	const key = "order-lost"

	var firstErr, cause error
	h := idem.Middleware(middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}.Middleware(
		func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			if firstErr == nil {
				firstErr = a.book(ctx, fx, key, true)
				return nil, firstErr
			}
			if err := b.store.Delete(context.Background(), "idem::"+key); err != nil {
				return nil, err
			}
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
	assert.Zero(t, effectsOf(t, direct, fx, key))
}

// A completion whose transaction committed ends the lease quietly: the next
// renewal finds the key COMPLETED under the run's own token
// (ErrCompletedByOwner), and the handler's context is not cancelled though
// it goes on past the lease.
func TestCommittedCompletionEndsTheLeaseQuietly(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
	require.NoError(t, err)
	const key = "order-quiet"

	var ctxErr error
	_, err = idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		if err := a.book(ctx, fx, key, false); err != nil {
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
	assert.Equal(t, 1, effectsOf(t, direct, fx, key))
	rec, err := b.store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// A transaction that wrote COMPLETED and rolled back leaves the run as it
// was: renewed, and, when the handler then succeeds without another
// transactional completion, completed by the middleware. Before, the run
// stopped renewing and wrote nothing, and the key was left to lapse.
func TestRolledBackCompletionLeavesTheRunRenewed(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
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
		before := obs.ok.Load()
		if !waitFor(func() bool { return obs.ok.Load() >= before+2 }, 10*commitLease) {
			return nil, errors.New("the run stopped renewing after its transaction rolled back")
		}
		return []*message.Message{message.NewMessage("receipt-"+key, []byte("done"))}, ctx.Err()
	})(newMessage(key))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.EqualValues(t, 1, obs.completes.Load(), "the middleware wrote COMPLETED")
	rec, err := b.store.Get(context.Background(), "idem::"+key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "the successful run is COMPLETED, not left to lapse")
	assert.Zero(t, effectsOf(t, direct, fx, key))
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
// renewals wait for its row lock and cannot tell the lease is kept, so the
// handler's context is cancelled with ErrLeaseLost before the lease can
// lapse, as for a handler whose renewals fail; database/sql rolls the
// transaction back when that context ends, the COMMIT does not happen, and
// the second consumer's copy runs only after the first handler returned.
// Before, the run stopped renewing at CompleteInTx and its context was
// never cancelled.
func TestTransactionHeldOpenPastTheLease(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1}, nil)
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
			tx, err := a.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback() }()
			// Left before the deferred rollback (database/sql also rolls the
			// transaction back as soon as its context ends).
			defer ov.enter()()
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
			case <-time.After(10 * commitLease):
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
	ranB := contend(t, b, fx, key, ov, done)

	require.ErrorIs(t, cause, idempotency.ErrLeaseLost, "the held transaction's context is cancelled")
	assert.Error(t, commitErr, "the COMMIT under the cancelled context does not happen")
	assert.False(t, ov.seen.Load(), "the second consumer's handler ran beside the first one")
	assert.EqualValues(t, 1, ranB.Load(), "the second consumer's copy ran, once")
	assert.Equal(t, 1, effectsOf(t, direct, fx, key), "one effect: the second consumer's")
}

// A COMMIT whose answer was lost (it committed; the handler saw an error),
// with Retry inside: the retry's completion says ErrAlreadyCompleted and
// rolls back, the renewals have ended quietly (the key is COMPLETED under
// the run's token), the retry's context is not cancelled, and a second
// consumer's copy is a duplicate. One effect. The lost answer is the
// handler's own error after a COMMIT that succeeded: cutting the COMMIT's
// reply through the proxy (TestConnectionCuts does, on a one-connection
// pool) could cut a renewal's reply instead, since the renewal that waited
// for the row answers at the same moment.
func TestLostCommitAnswerWithRetryInside(t *testing.T) {
	a, b, fx, direct := commitSetup(t)
	obs := &renewals{}
	idem, err := idempotency.New(idempotency.Config{Store: a.store, LeaseTTL: commitLease, NackDelay: -1, Observer: obs}, nil)
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
				if err := a.book(ctx, fx, key, false); err != nil {
					return nil, err
				}
				return nil, errors.New("the COMMIT's answer was lost")
			}
			close(retrying)
			select {
			case <-time.After(2 * commitLease):
			case <-ctx.Done():
			}
			secondErr = a.book(ctx, fx, key, false)
			ctxErr = ctx.Err()
			if errors.Is(secondErr, mysqlstore.ErrAlreadyCompleted) {
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
	ranB := contend(t, b, fx, key, ov, done)

	require.NoError(t, aErr)
	require.ErrorIs(t, secondErr, mysqlstore.ErrAlreadyCompleted)
	assert.NoError(t, ctxErr, "the retry's context is not cancelled")
	assert.False(t, ov.seen.Load())
	assert.Zero(t, ranB.Load(), "the second consumer's copy is a duplicate")
	assert.Zero(t, obs.lost.Load())
	assert.Equal(t, int32(1), obs.completedByOwner.Load(), "a renewal found the key completed by the run")
	assert.Equal(t, 1, effectsOf(t, direct, fx, key))
}
