package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// TestRenewalWitnessesTheCompletionsEnd: a renewal of a key whose owner
// wrote COMPLETED in a transaction that is still open waits for that
// transaction, and then tells how it ended: ErrCompletedByOwner (never
// ErrLeaseLost) after a COMMIT, success and a later deadline after a
// ROLLBACK. It holds whatever the store's sessions' isolation level (the
// server's REPEATABLE READ, or READ COMMITTED set for every session through
// the DSN, as the package doc suggests for the handlers' transactions, under
// which InnoDB's UPDATE reads a locked row semi-consistently) and whether
// the renewal reaches the server before the transaction ends or after; the
// keys alternate so that both races are run many times.
func TestRenewalWitnessesTheCompletionsEnd(t *testing.T) {
	ctx := context.Background()
	sessions := []struct {
		name string
		vars map[string]string
	}{
		{"server-default", nil},
		{"read-committed-sessions", map[string]string{"tx_isolation": "'READ-COMMITTED'"}},
	}
	for _, sess := range sessions {
		t.Run(sess.name, func(t *testing.T) {
			db := testDB(t)
			_, table := newTable(t, db)
			storeDB := db
			if sess.vars != nil {
				storeDB = dbWith(t, sess.vars)
			}
			s, err := mysqlstore.New(storeDB, mysqlstore.Config{Table: table})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			for i := range 40 {
				commit := i%2 == 0
				key := fmt.Sprintf("k-%d", i)
				tok := claim(t, s, key, time.Minute, time.Minute)
				before, err := s.Get(ctx, key)
				require.NoError(t, err)
				tx, err := storeDB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
				require.NoError(t, err)
				require.NoError(t, s.CompleteTx(ctx, tx, key, tok, []byte("r"), time.Minute))
				renewed := make(chan error, 1)
				go func() { renewed <- s.Renew(ctx, key, tok, time.Minute) }()
				if i < 2 {
					select {
					case err := <-renewed:
						t.Fatalf("%s: the renewal went past the open transaction: %v", key, err)
					case <-time.After(100 * time.Millisecond):
					}
				} else {
					time.Sleep(time.Duration(i%5) * time.Millisecond)
				}
				if commit {
					require.NoError(t, tx.Commit())
					err := <-renewed
					require.ErrorIs(t, err, idempotency.ErrCompletedByOwner, "%s: the renewal after the COMMIT", key)
					require.NotErrorIs(t, err, idempotency.ErrLeaseLost, "%s", key)
					continue
				}
				require.NoError(t, tx.Rollback())
				require.NoError(t, <-renewed, "%s: the renewal after the ROLLBACK", key)
				after, err := s.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateInProgress, after.State, "%s", key)
				assert.True(t, after.LeaseExpiresAt.After(before.LeaseExpiresAt), "%s: the renewal moved the deadline", key)
			}
		})
	}
}

// TestAbandonedRenewalIsAppliedLate: a renewal that gives up waiting for an
// in-transaction completion's row lock (its context ends; go-sql-driver
// closes its connection) is not withdrawn: the server runs its UPDATE once
// the lock is released, and after a rollback it renews the lease, from
// when the statement started. The package doc states this; the key then
// stays held for at most a lease from then, never longer.
func TestAbandonedRenewalIsAppliedLate(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, _ := newTable(t, db)
	tok := claim(t, s, "k", 2*time.Second, time.Minute)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	require.NoError(t, err)
	require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Minute))
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = s.Renew(rctx, "k", tok, time.Minute)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the renewal gave up waiting")
	require.NoError(t, tx.Rollback())
	ok := sqlstoretest.WaitFor(func() bool {
		rec, err := s.Get(ctx, "k")
		require.NoError(t, err)
		return time.Until(rec.LeaseExpiresAt) > 10*time.Second
	}, 5*time.Second)
	assert.True(t, ok, "the abandoned renewal's UPDATE ran after the rollback and moved the deadline a minute on")
}
