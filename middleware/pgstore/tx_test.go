package pgstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// lease is the lease of the claims whose lapse the tests wait for.
const lease = 300 * time.Millisecond

// effects returns a new table of effects, one row per key, dropped when the
// test ends.
func effects(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := uniqueName("pgstore_test_effects_")
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+quoted(table)+` (key text PRIMARY KEY)`)
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, pool, table) })
	return table
}

func countEffects(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	return rows(t, pool, table)
}

func TestCompleteTxCommitsWithTheEffect(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	fx := effects(t, pool)
	tok := claim(t, s, "k", time.Minute, time.Minute)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, []byte("receipt"), time.Minute))

	// A duplicate arriving now waits for the transaction, then replays.
	dup := make(chan idempotency.ClaimResult, 1)
	go func() {
		res, err := s.Claim(ctx, "k", idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
		assert.NoError(t, err)
		dup <- res
	}()
	select {
	case res := <-dup:
		t.Fatalf("a claim went past the uncommitted completion: %+v", res)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	res := <-dup
	assert.False(t, res.Acquired)
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Equal(t, []byte("receipt"), res.Record.Result)

	assert.NoError(t, s.Complete(ctx, "k", tok, []byte("again"), time.Minute),
		"the owner's Complete after its CompleteTx committed is a resend")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("receipt"), rec.Result)
	assert.Equal(t, 1, countEffects(t, pool, fx))
}

func TestCompleteTxRolledBackKeepsTheLease(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	tok := claim(t, s, "k", time.Minute, time.Minute)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, nil, time.Minute))
	require.NoError(t, tx.Rollback(ctx))

	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a rolled back completion leaves the claim")
	assert.Equal(t, tok, rec.Token)
	require.NoError(t, s.Complete(ctx, "k", tok, nil, time.Minute))
	rec, err = s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte{}, rec.Result, "a nil result is stored as an empty one")
}

// TestCompleteTxFencesALostLease: a handler paused past its lease while
// another owner took the key over cannot complete, and its transaction rolls
// back, effect included.
func TestCompleteTxFencesALostLease(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	fx := effects(t, pool)
	stale := claim(t, s, "k", lease, time.Minute)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
	require.NoError(t, err)
	time.Sleep(lease + 100*time.Millisecond)
	fresh := claim(t, s, "k", time.Minute, time.Minute)

	err = s.CompleteTx(ctx, tx, "k", stale, []byte("stale"), time.Minute)
	require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	require.NoError(t, tx.Rollback(ctx))
	assert.Zero(t, countEffects(t, pool, fx), "the stale owner's effect rolled back")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, fresh, rec.Token, "the new owner holds the key")
	assert.Equal(t, 2, rec.Attempts)
}

// TestCompleteTxReadsTheStatementsClock: inside a transaction that began
// while the lease was live, a completion after the lease lapsed is fenced
// although nobody claimed the key since. The store reads
// statement_timestamp(); now() would be the transaction's start, and let the
// lapsed owner complete.
func TestCompleteTxReadsTheStatementsClock(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	tok := claim(t, s, "k", lease, time.Minute)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var start time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT now()`).Scan(&start))
	time.Sleep(lease + 100*time.Millisecond)
	assert.ErrorIs(t, s.CompleteTx(ctx, tx, "k", tok, nil, time.Minute), idempotency.ErrLeaseLost)
	require.NoError(t, tx.Rollback(ctx))
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "the lapsed lease reads as FAILED")
}

func TestCompleteTxWithDatabaseSQL(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	fx := effects(t, pool)
	db := sql.OpenDB(stdlib.GetPoolConnector(pool))
	t.Cleanup(func() { _ = db.Close() })

	tok := claim(t, s, "k", time.Minute, time.Minute)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
	require.NoError(t, err)
	require.NoError(t, s.CompleteTx(ctx, sqlTx{tx}, "k", tok, []byte("r"), time.Minute))
	require.NoError(t, tx.Commit())
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)

	// The fence answers through database/sql as through pgx. A second
	// transaction of the same owner must not commit: its effect would be a
	// double.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	assert.ErrorIs(t, s.CompleteTx(ctx, sqlTx{tx}, "k", tok, []byte("r"), time.Minute), pgstore.ErrAlreadyCompleted,
		"a second transaction of the owner that committed")
	assert.ErrorIs(t, s.CompleteTx(ctx, sqlTx{tx}, "k", storekit.NewToken(), nil, time.Minute), idempotency.ErrLeaseLost)
	assert.Equal(t, 1, countEffects(t, pool, fx))
}

var _ pgstore.Querier = pgx.Tx(nil)

// sqlTx is the adapter of a *sql.Tx to Querier that Querier's doc shows.
type sqlTx struct{ *sql.Tx }

func (t sqlTx) QueryRow(ctx context.Context, q string, args ...any) pgx.Row {
	return t.QueryRowContext(ctx, q, args...)
}

// TestCompleteTxUnderRepeatableRead: a REPEATABLE READ transaction sees the
// record as its snapshot has it. When the owner's renewal changed the row
// since, the completion is a serialization failure (40001); when the
// transaction outlived the lease its snapshot shows, the snapshot's row
// fails the fence first, and the completion is ErrLeaseLost, although the
// owner's renewals kept the lease alive.
func TestCompleteTxUnderRepeatableRead(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	begin := func() pgx.Tx {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		// The snapshot is taken by the transaction's first statement.
		_, err = tx.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
		return tx
	}

	tok := claim(t, s, "renewed", time.Minute, time.Minute)
	tx := begin()
	require.NoError(t, s.Renew(ctx, "renewed", tok, time.Minute))
	err := s.CompleteTx(ctx, tx, "renewed", tok, nil, time.Minute)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a row renewed since the snapshot")
	assert.Equal(t, "40001", pgErr.Code)

	tok = claim(t, s, "outlived", lease, time.Minute)
	tx = begin()
	require.NoError(t, s.Renew(ctx, "outlived", tok, time.Minute))
	time.Sleep(lease + 100*time.Millisecond)
	err = s.CompleteTx(ctx, tx, "outlived", tok, nil, time.Minute)
	assert.ErrorIs(t, err, idempotency.ErrLeaseLost, "the snapshot's lease is over")
	assert.False(t, errors.As(err, &pgErr), "not a serialization failure: %v", err)
	rec, err := s.Get(ctx, "outlived")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "the renewed lease is live")
}
