package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

func rows(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(context.Background(), `SELECT count(*) FROM `+quoted(table)).Scan(&n))
	return n
}

func claim(t *testing.T, s *mysqlstore.Store, key string, lease, ttl time.Duration) string {
	t.Helper()
	return sqlstoretest.Claim(t, s, key, lease, ttl)
}

// sqlTable is a store on a fresh table, for the cases of sqlstoretest.
func sqlTable(t *testing.T) sqlstoretest.Table {
	db := testDB(t)
	s, table := newTable(t, db)
	return caseTable(db, s, table)
}

// caseTable is s, a store on table, for the cases of sqlstoretest.
func caseTable(db *sql.DB, s *mysqlstore.Store, table string) sqlstoretest.Table {
	return sqlstoretest.Table{
		Store:           s,
		Rows:            func(t *testing.T) int { return rows(t, db, table) },
		PutCorrupt:      func(t *testing.T, key string) { putCorrupt(t, db, table, key) },
		ErrInvalidBatch: mysqlstore.ErrInvalidBatch,
		CompleteInTx: func(t *testing.T, key, token string) func(bool) {
			tx := begin(t, db, sql.LevelReadCommitted)
			require.NoError(t, s.CompleteTx(context.Background(), tx, key, token, []byte("r"), time.Hour))
			return func(commit bool) {
				if commit {
					require.NoError(t, tx.Commit())
				} else {
					require.NoError(t, tx.Rollback())
				}
			}
		},
	}
}

func TestPurgeDeletesExpiredRowsInBatches(t *testing.T) {
	sqlstoretest.PurgeDeletesExpiredRowsInBatches(t, sqlTable(t))
}

func TestPurgeRacesClaims(t *testing.T) { sqlstoretest.PurgeRacesClaims(t, sqlTable(t)) }
