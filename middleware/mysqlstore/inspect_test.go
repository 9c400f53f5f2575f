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
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// Records pages through every live record under its prefix, whatever the
// page size; expired rows are skipped and corrupt rows carry their Err.
// Counts made of it are exact.
func TestRecordsAndCounts(t *testing.T) {
	t.Parallel()
	tb := sqlTable(t)
	sqlstoretest.RecordsAndCounts(t, tb, tb.Store.(*mysqlstore.Store).RecordsBatch)
}

// DeleteIf deletes only in the states named and reports what it found; a
// lapsed lease is FAILED; a corrupt row is kept.
func TestDeleteIf(t *testing.T) {
	t.Parallel()
	sqlstoretest.DeleteIf(t, sqlTable(t))
}

// putCorrupt writes a row that is not a record under key, as a table without
// the CHECK constraint (older, or made by hand) may hold.
func putCorrupt(t *testing.T, db *sql.DB, table, key string) {
	t.Helper()
	_, err := db.ExecContext(context.Background(), "ALTER TABLE "+quoted(table)+" DROP CONSTRAINT IF EXISTS "+quoted(table+"_record_valid"))
	require.NoError(t, err)
	require.NoError(t, putForeign(db, table, key, "bad-fields"))
}

// A table made by hand may lack the NOT NULL constraints: a row with no
// state and no expiry is corrupt for DeleteIf, Records and Get alike, and
// DeleteIf keeps it.
func TestNullColumnsAreCorrupt(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	ctx := context.Background()
	s, table := newTable(t, db)
	for _, ddl := range []string{
		"ALTER TABLE " + quoted(table) + " DROP CONSTRAINT " + quoted(table+"_record_valid"),
		"ALTER TABLE " + quoted(table) + " MODIFY state VARBINARY(255) NULL, MODIFY expires_at DATETIME(6) NULL",
	} {
		_, err := db.ExecContext(ctx, ddl)
		require.NoError(t, err)
	}
	_, err := db.ExecContext(ctx, "INSERT INTO "+quoted(table)+" (key_hash, `key`, attempts, created_at, updated_at) VALUES (UNHEX(SHA2('k', 256)), 'k', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")
	require.NoError(t, err)
	_, _, err = s.DeleteIf(ctx, "k", idempotency.StateFailed, idempotency.StateInProgress, idempotency.StateCompleted)
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	_, _, _, err = sqlstoretest.Inspect(ctx, s, "k")
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	_, err = s.Get(ctx, "k")
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	_, err = s.Claim(ctx, "k", idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	assert.Equal(t, 1, rows(t, db, table), "the corrupt row is kept")
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
