package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// dbWith opens a second *sql.DB on the shared server whose sessions set the
// given system variables (go-sql-driver sends unknown DSN parameters as SET
// statements), so that no test changes the sessions of testDB's pool.
func dbWith(t *testing.T, vars map[string]string) *sql.DB {
	t.Helper()
	testDB(t) // fails the test when the server is missing
	cfg, err := mysql.ParseDSN(testserver.MySQLDSN())
	require.NoError(t, err)
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	for k, v := range vars {
		cfg.Params[k] = v
	}
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// mysqlErrno returns the server's error number of err, or 0.
func mysqlErrno(err error) uint16 {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number
	}
	return 0
}

// TestSnapshotIsolationRefusesRepeatableRead: MariaDB's
// innodb_snapshot_isolation (ON by default from 11.8) makes a locking read
// under REPEATABLE READ fail when the row changed after the transaction's
// snapshot. The owner's renewal does that to the record's row, so the
// in-transaction completion fails (error 1020) and the effect cannot commit
// at REPEATABLE READ; at READ COMMITTED every statement has a new snapshot,
// and the completion succeeds. This is why the package asks for READ
// COMMITTED.
func TestSnapshotIsolationRefusesRepeatableRead(t *testing.T) {
	db := dbWith(t, map[string]string{"innodb_snapshot_isolation": "ON"})
	ctx := context.Background()
	if err := db.PingContext(ctx); mysqlErrno(err) == 1193 { // ER_UNKNOWN_SYSTEM_VARIABLE
		t.Skipf("this server has no innodb_snapshot_isolation (MySQL, or MariaDB before 10.6.18): %v", err)
	}
	s, _ := newTable(t, testDB(t))
	s2, err := mysqlstore.New(db, mysqlstore.Config{Table: tableOf(t, s)})
	require.NoError(t, err)

	for _, c := range []struct {
		name  string
		level sql.IsolationLevel
		errno uint16
	}{{"repeatable-read", sql.LevelRepeatableRead, 1020}, {"read-committed", sql.LevelReadCommitted, 0}} {
		t.Run(c.name, func(t *testing.T) {
			key := "k-" + c.name
			tok := claim(t, s, key, time.Minute, time.Minute)
			tx := begin(t, db, c.level)
			var n int // REPEATABLE READ's snapshot starts with the transaction's first read
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT count(*) FROM `+quoted(tableOf(t, s))).Scan(&n))
			require.NoError(t, s.Renew(ctx, key, tok, time.Minute))
			err = s2.CompleteTx(ctx, tx, key, tok, []byte("r"), time.Minute)
			if c.errno == 0 {
				require.NoError(t, err)
				require.NoError(t, tx.Commit())
				return
			}
			require.Error(t, err)
			assert.Equal(t, c.errno, mysqlErrno(err), "%v", err)
			require.NoError(t, tx.Rollback())
			rec, err := s.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateInProgress, rec.State, "nothing committed")
		})
	}
}

// TestCompletionLocks shows the locks the in-transaction completion holds
// until its transaction ends, by what a claim of the same or another key,
// on a session that waits one second for a lock, can do meanwhile:
//
//   - applied, at any level: an exclusive lock on the record's row; a claim
//     or a renewal of the key waits (and here times out), a claim or a
//     renewal of any other key does not;
//   - refused because the row is gone (an operator deleted it), under
//     REPEATABLE READ: a gap lock where the row would be, so a claim of that
//     key (or of any key whose hash falls in the same gap) waits until the
//     transaction rolls back; under READ COMMITTED, no lock at all.
func TestCompletionLocks(t *testing.T) {
	ctx := context.Background()
	waiter := dbWith(t, map[string]string{"innodb_lock_wait_timeout": "1"})
	claimOn := func(s *mysqlstore.Store, key string) error {
		_, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
		return err
	}
	for _, il := range isolationLevels[1:3] { // read-committed, repeatable-read
		t.Run(il.name, func(t *testing.T) {
			db := testDB(t)
			s, table := newTable(t, db)
			w, err := mysqlstore.New(waiter, mysqlstore.Config{Table: table})
			require.NoError(t, err)

			tok := claim(t, s, "held", time.Minute, time.Minute)
			neighbour := claim(t, s, "renewed", time.Minute, time.Minute)
			tx := begin(t, db, il.level)
			require.NoError(t, s.CompleteTx(ctx, tx, "held", tok, []byte("r"), time.Minute))
			assert.Equal(t, uint16(1205), mysqlErrno(claimOn(w, "held")), "a claim of the completed key waits for the commit")
			assert.Equal(t, uint16(1205), mysqlErrno(w.Renew(ctx, "held", tok, time.Minute)),
				"so does a renewal of it, which tells the run how the transaction ended (TestRenewalWitnessesTheCompletionsEnd)")
			for _, other := range []string{"other-1", "other-2", "other-3"} {
				assert.NoError(t, claimOn(w, other), "a claim of another key does not wait")
			}
			assert.NoError(t, w.Renew(ctx, "renewed", neighbour, time.Minute), "nor does a renewal of another key")
			require.NoError(t, tx.Commit())

			gone := claim(t, s, "gone", time.Minute, time.Minute)
			require.NoError(t, s.Delete(ctx, "gone"))
			tx = begin(t, db, il.level)
			require.ErrorIs(t, s.CompleteTx(ctx, tx, "gone", gone, nil, time.Minute), idempotency.ErrLeaseLost)
			err = claimOn(w, "gone")
			if il.level == sql.LevelRepeatableRead {
				assert.Equal(t, uint16(1205), mysqlErrno(err), "REPEATABLE READ: the refused completion's gap lock blocks the key's insert: %v", err)
			} else {
				assert.NoError(t, err, "READ COMMITTED: no gap lock")
			}
			require.NoError(t, tx.Rollback())
		})
	}
}

// TestIdleTransactionTimeoutEndsAStalledCompletion: a consumer that stalls
// between its in-transaction completion and its COMMIT holds the record's
// row lock, and every claim of the key waits for it. MariaDB's
// idle_write_transaction_timeout (set here through the DSN, in
// seconds) ends such a session: its transaction rolls back, effect and
// completion included, the lock goes, and the COMMIT fails, so the
// consumer's handler returns an error and nothing is acked. This is the
// setting that plays PostgreSQL's idle_in_transaction_session_timeout.
func TestIdleTransactionTimeoutEndsAStalledCompletion(t *testing.T) {
	db := dbWith(t, map[string]string{"idle_write_transaction_timeout": "1"})
	ctx := context.Background()
	if err := db.PingContext(ctx); mysqlErrno(err) == 1193 {
		t.Skipf("this server has no idle_write_transaction_timeout (MySQL): %v", err)
	}
	s, table := newTable(t, testDB(t))
	stalled, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
	require.NoError(t, err)
	fx := effects(t, testDB(t))
	tok := claim(t, s, "k", time.Minute, time.Minute)

	tx := begin(t, db, sql.LevelReadCommitted)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+quoted(fx)+` VALUES ('k')`)
	require.NoError(t, err)
	require.NoError(t, stalled.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Minute))
	start := time.Now()
	res, err := s.Claim(ctx, "k", idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
	require.NoError(t, err, "the claim waited for the stalled session's end, not for its lock wait timeout")
	waited := time.Since(start)
	assert.False(t, res.Acquired)
	assert.Equal(t, idempotency.StateInProgress, res.Record.State, "the completion rolled back with the session")
	assert.Error(t, tx.Commit(), "the stalled consumer's COMMIT fails")
	assert.Zero(t, rows(t, testDB(t), fx), "its effect rolled back")
	t.Logf("the claim waited %v for the stalled transaction", waited.Round(10*time.Millisecond))
}
