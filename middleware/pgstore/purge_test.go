package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

func rows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+quoted(table)).Scan(&n))
	return n
}

func claim(t *testing.T, s *pgstore.Store, key string, lease, ttl time.Duration) string {
	t.Helper()
	return sqlstoretest.Claim(t, s, key, lease, ttl)
}

// sqlTable is a store on a fresh table, for the cases of sqlstoretest.
func sqlTable(t *testing.T) sqlstoretest.Table {
	pool := testPool(t)
	s, table := newTable(t, pool)
	return tableOf(pool, s, table)
}

// tableOf is s, a store on table, for the cases of sqlstoretest.
func tableOf(pool *pgxpool.Pool, s *pgstore.Store, table string) sqlstoretest.Table {
	return sqlstoretest.Table{
		Store:           s,
		Rows:            func(t *testing.T) int { return rows(t, pool, table) },
		PutCorrupt:      func(t *testing.T, key string) { putCorrupt(t, pool, table, key) },
		ErrInvalidBatch: pgstore.ErrInvalidBatch,
		CompleteInTx: func(t *testing.T, key, token string) func(bool) {
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			require.NoError(t, s.CompleteTx(ctx, tx, key, token, []byte("r"), time.Hour))
			return func(commit bool) {
				if commit {
					require.NoError(t, tx.Commit(ctx))
				} else {
					require.NoError(t, tx.Rollback(ctx))
				}
			}
		},
	}
}

func TestPurgeDeletesExpiredRowsInBatches(t *testing.T) {
	sqlstoretest.PurgeDeletesExpiredRowsInBatches(t, sqlTable(t))
}

func TestPurgeRacesClaims(t *testing.T) { sqlstoretest.PurgeRacesClaims(t, sqlTable(t)) }
