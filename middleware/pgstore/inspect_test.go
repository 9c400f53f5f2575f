package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// Records pages through every live record under its prefix, whatever the
// page size; expired rows are skipped and corrupt rows carry their Err.
// Counts made of it are exact.
func TestRecordsAndCounts(t *testing.T) {
	t.Parallel()
	tb := sqlTable(t)
	sqlstoretest.RecordsAndCounts(t, tb, tb.Store.(*pgstore.Store).RecordsBatch)
}

// DeleteIf deletes only in the states named and reports what it found; a
// lapsed lease is FAILED; a corrupt row is kept.
func TestDeleteIf(t *testing.T) {
	t.Parallel()
	sqlstoretest.DeleteIf(t, sqlTable(t))
}

// putCorrupt writes a row that is not a record under key, as a table without
// the CHECK constraint (older, or made by hand) may hold.
func putCorrupt(t *testing.T, pool *pgxpool.Pool, table, key string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), "ALTER TABLE "+quoted(table)+" DROP CONSTRAINT IF EXISTS idempotency_record_valid")
	require.NoError(t, err)
	require.NoError(t, putForeign(pool, table, key, "bad-fields"))
}

// Records selects by the prefix's bytes exactly: no LIKE wildcard or escape.
func TestRecordsOddPrefixes(t *testing.T) {
	t.Parallel()
	sqlstoretest.RecordsOddPrefixes(t, sqlTable(t))
}

// Records over three pages, its loop changing the table, yields each
// unchanged record once.
func TestRecordsAcrossPagesWhileChanging(t *testing.T) {
	t.Parallel()
	sqlstoretest.RecordsAcrossPagesWhileChanging(t, sqlTable(t))
}
