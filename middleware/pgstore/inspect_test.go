package pgstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// Records pages through every live record under its prefix, whatever the
// page size; expired rows are skipped and corrupt rows carry their Err.
// Counts agrees with it.
func TestRecordsAndCounts(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := context.Background()
	s, table := newTable(t, pool)
	want := map[string]idempotency.State{}
	for i := range 7 {
		key := "p:done:" + strconv.Itoa(i)
		tok := claim(t, s, key, time.Minute, time.Minute)
		require.NoError(t, s.Complete(ctx, key, tok, []byte("result"), time.Hour))
		want[key] = idempotency.StateCompleted
	}
	claim(t, s, "p:busy", time.Minute, time.Minute)
	want["p:busy"] = idempotency.StateInProgress
	claim(t, s, "p:lapsed", 5*time.Millisecond, time.Minute)
	want["p:lapsed"] = idempotency.StateFailed
	claim(t, s, "p:gone", 5*time.Millisecond, 5*time.Millisecond) // expires at once
	claim(t, s, "other:x", time.Minute, time.Minute)
	putCorrupt(t, pool, table, "p:bad")
	time.Sleep(30 * time.Millisecond)

	for _, batch := range []int{1, 3, 0} {
		got := map[string]idempotency.State{}
		corrupt := 0
		for e, err := range s.Records(ctx, "p:", batch) {
			require.NoError(t, err)
			if e.Err != nil {
				assert.ErrorIs(t, e.Err, idempotency.ErrCorruptRecord)
				assert.Equal(t, "p:bad", e.Key)
				corrupt++
				continue
			}
			got[e.Key] = e.Record.State
			assert.Greater(t, e.Bytes, int64(0))
			assert.Greater(t, e.TTL, time.Duration(0))
		}
		assert.Equal(t, want, got, "batch %d", batch)
		assert.Equal(t, 1, corrupt, "batch %d", batch)
	}

	counts, err := s.Counts(ctx, "p:")
	require.NoError(t, err)
	assert.Equal(t, int64(7), counts["completed"].Records)
	assert.Equal(t, int64(1), counts["in_progress"].Records)
	assert.Equal(t, int64(1), counts["failed"].Records, "the lapsed lease")
	assert.Equal(t, int64(1), counts[pgstore.CountCorrupt].Records)
	assert.Greater(t, counts["completed"].MeanBytes, int64(0))
	assert.Len(t, counts, 4)
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
	require.NoError(t, putForeign(pool, table, key, storetest.ForeignBadFields))
}
