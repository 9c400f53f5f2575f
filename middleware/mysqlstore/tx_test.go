package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// lease is the lease of the claims whose lapse the tests wait for.
const lease = 300 * time.Millisecond

// effects returns a new table of effects, one row per key, dropped when the
// test ends.
func effects(t *testing.T, db *sql.DB) string {
	t.Helper()
	table := uniqueName("mysqlstore_test_effects_")
	_, err := db.ExecContext(context.Background(), `CREATE TABLE `+quoted(table)+` (k VARCHAR(200) PRIMARY KEY) ENGINE=InnoDB`)
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, db, table) })
	return table
}

func begin(t *testing.T, db *sql.DB, level sql.IsolationLevel) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: level})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func TestCompleteTxCommitsWithTheEffect(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, _ := newTable(t, db)
	fx := effects(t, db)
	tok := claim(t, s, "k", time.Minute, time.Minute)

	tx := begin(t, db, sql.LevelReadCommitted)
	_, err := tx.ExecContext(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
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
	require.NoError(t, tx.Commit())
	res := <-dup
	assert.False(t, res.Acquired)
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Equal(t, []byte("receipt"), res.Record.Result)

	assert.NoError(t, s.Complete(ctx, "k", tok, []byte("again"), time.Minute),
		"the owner's Complete after its CompleteTx committed is a resend")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("receipt"), rec.Result)
	assert.Equal(t, 1, rows(t, db, fx))
}

func TestCompleteTxRolledBackKeepsTheLease(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, _ := newTable(t, db)
	tok := claim(t, s, "k", time.Minute, time.Minute)
	tx := begin(t, db, sql.LevelReadCommitted)
	require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, nil, time.Minute))
	require.NoError(t, tx.Rollback())

	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a rolled back completion leaves the claim")
	assert.Equal(t, tok, rec.Token)
	require.NoError(t, s.Complete(ctx, "k", tok, nil, time.Minute))
	rec, err = s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte{}, rec.Result, "a nil result is stored as an empty one")
}

// isolationLevels are InnoDB's four, with the names the tests report.
var isolationLevels = []struct {
	name  string
	level sql.IsolationLevel
}{
	{"read-uncommitted", sql.LevelReadUncommitted},
	{"read-committed", sql.LevelReadCommitted},
	{"repeatable-read", sql.LevelRepeatableRead},
	{"serializable", sql.LevelSerializable},
}

// TestCompleteTxFencesALostLease: a handler paused past its lease while
// another owner took the key over cannot complete, and its transaction rolls
// back, effect included, at every isolation level, also when the
// transaction took its snapshot while the lease was still its own.
func TestCompleteTxFencesALostLease(t *testing.T) {
	for _, il := range isolationLevels {
		t.Run(il.name, func(t *testing.T) {
			db := testDB(t)
			ctx := context.Background()
			s, _ := newTable(t, db)
			fx := effects(t, db)
			stale := claim(t, s, "k", lease, time.Minute)

			tx := begin(t, db, il.level)
			var n int // the snapshot of REPEATABLE READ starts here, lease live
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT count(*) FROM `+quoted(fx)).Scan(&n))
			_, err := tx.ExecContext(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
			require.NoError(t, err)
			time.Sleep(lease + 100*time.Millisecond)
			fresh := claim(t, s, "k", time.Minute, time.Minute)

			err = s.CompleteTx(ctx, tx, "k", stale, []byte("stale"), time.Minute)
			require.ErrorIs(t, err, idempotency.ErrLeaseLost)
			require.NoError(t, tx.Rollback())
			assert.Zero(t, rows(t, db, fx), "the stale owner's effect rolled back")
			rec, err := s.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, fresh, rec.Token, "the new owner holds the key")
			assert.Equal(t, 2, rec.Attempts)
		})
	}
}

// TestCompleteTxAfterRenewals: the owner's renewals change the record's row
// while the handler's transaction runs; the completion still succeeds at
// every isolation level, since InnoDB's UPDATE judges the latest version
// (with MariaDB's innodb_snapshot_isolation OFF, see
// TestSnapshotIsolationRefusesRepeatableRead).
func TestCompleteTxAfterRenewals(t *testing.T) {
	for _, il := range isolationLevels {
		t.Run(il.name, func(t *testing.T) {
			db := testDB(t)
			ctx := context.Background()
			s, _ := newTable(t, db)
			fx := effects(t, db)
			tok := claim(t, s, "k", time.Minute, time.Minute)

			tx := begin(t, db, il.level)
			var n int
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT count(*) FROM `+quoted(fx)).Scan(&n))
			_, err := tx.ExecContext(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
			require.NoError(t, err)
			require.NoError(t, s.Renew(ctx, "k", tok, time.Minute))
			require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Minute))
			require.NoError(t, tx.Commit())
			rec, err := s.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateCompleted, rec.State)
			assert.Equal(t, 1, rows(t, db, fx))
		})
	}
}

// TestCompleteTxReadsTheStatementsClock: inside a transaction that began
// while the lease was live, a completion after the lease lapsed is fenced
// although nobody claimed the key since: UTC_TIMESTAMP(6) is read when the
// statement starts, not when the transaction did.
func TestCompleteTxReadsTheStatementsClock(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, _ := newTable(t, db)
	tok := claim(t, s, "k", lease, time.Minute)

	tx := begin(t, db, sql.LevelRepeatableRead)
	var start string
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(6)`).Scan(&start))
	time.Sleep(lease + 100*time.Millisecond)
	assert.ErrorIs(t, s.CompleteTx(ctx, tx, "k", tok, nil, time.Minute), idempotency.ErrLeaseLost)
	require.NoError(t, tx.Rollback())
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "the lapsed lease reads as FAILED")
}

// TestSecondTransactionSeesTheFirstCommit: a second transaction of the same
// owner must not commit, at every isolation level, even when its snapshot
// predates the first one's commit: the completion's refusal reads the row
// with a locking read, which sees the committed COMPLETED, not the snapshot's
// IN_PROGRESS.
func TestSecondTransactionSeesTheFirstCommit(t *testing.T) {
	for _, il := range isolationLevels {
		t.Run(il.name, func(t *testing.T) {
			db := testDB(t)
			ctx := context.Background()
			s, table := newTable(t, db)
			fx := effects(t, db)
			tok := claim(t, s, "k", time.Minute, time.Minute)

			second := begin(t, db, il.level)
			if il.level != sql.LevelSerializable { // SERIALIZABLE would lock the row against the first
				var n int // the snapshot, with the key IN_PROGRESS
				require.NoError(t, second.QueryRowContext(ctx, `SELECT count(*) FROM `+quoted(table)+` WHERE state = 'in_progress'`).Scan(&n))
				require.Equal(t, 1, n)
			}
			first := begin(t, db, il.level)
			_, err := first.ExecContext(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
			require.NoError(t, err)
			require.NoError(t, s.CompleteTx(ctx, first, "k", tok, []byte("r"), time.Minute))
			require.NoError(t, first.Commit())

			assert.ErrorIs(t, s.CompleteTx(ctx, second, "k", tok, []byte("r"), time.Minute), mysqlstore.ErrAlreadyCompleted,
				"a second transaction of the owner that committed")
			assert.ErrorIs(t, s.CompleteTx(ctx, second, "k", storekit.NewToken(), nil, time.Minute), idempotency.ErrLeaseLost)
			require.NoError(t, second.Rollback())
			assert.Equal(t, 1, rows(t, db, fx))
		})
	}
}

func TestCompleteTxRejectsANilTransaction(t *testing.T) {
	db := testDB(t)
	s, _ := newTable(t, db)
	assert.ErrorIs(t, s.CompleteTx(context.Background(), nil, "k", "tok", nil, time.Minute), mysqlstore.ErrNilTx)
}
