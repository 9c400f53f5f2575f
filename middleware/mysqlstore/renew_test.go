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
