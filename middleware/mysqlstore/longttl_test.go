package mysqlstore_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
)

// TestForeverTTLWithoutTheCheckConstraint: on a table without the CHECK
// constraint (one created by someone else, which the store must hold on),
// a "forever" lease and TTL (time.Duration(math.MaxInt64)) hold the key: a
// second claim is refused and the completed key is not run again. An
// unclamped INTERVAL is negative there, so the row expires at once.
func TestForeverTTLWithoutTheCheckConstraint(t *testing.T) {
	db := testDB(t)
	s, table := newTable(t, db)
	ctx := context.Background()
	_, err := db.ExecContext(ctx, "ALTER TABLE "+quoted(table)+" DROP CONSTRAINT "+quoted(table+"_record_valid"))
	require.NoError(t, err)

	forever := time.Duration(math.MaxInt64)
	first := idempotency.ClaimRequest{Token: "first", Lease: forever, TTL: forever}
	res, err := s.Claim(ctx, "forever", first)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	res, err = s.Claim(ctx, "forever", idempotency.ClaimRequest{Token: "second", Lease: time.Second, TTL: time.Hour})
	require.NoError(t, err)
	assert.False(t, res.Acquired, "a second claim while a forever lease holds the key")

	require.NoError(t, s.Renew(ctx, "forever", "first", forever))
	require.NoError(t, s.Complete(ctx, "forever", "first", []byte("done"), forever))
	res, err = s.Claim(ctx, "forever", idempotency.ClaimRequest{Token: "third", Lease: time.Second, TTL: time.Hour})
	require.NoError(t, err)
	assert.False(t, res.Acquired, "a completed key with a forever TTL is not run again")
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	var left int64
	require.NoError(t, db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), expires_at) FROM "+
		quoted(table)+" WHERE `key` = 'forever'").Scan(&left))
	assert.GreaterOrEqual(t, left, int64((idempotency.MaxTTL-time.Minute)/time.Second), "the completed key is kept for MaxTTL")
}

// TestRecordsLongestTTL: the longest expiry a record can have, a renewal's
// lease plus its claim's TTL at MaxTTL each (two hundred years, within
// DATETIME's year 9999), is reported by Records as it is, not overflowed
// into a negative duration.
func TestRecordsLongestTTL(t *testing.T) {
	db := testDB(t)
	s, _ := newTable(t, db)
	ctx := context.Background()
	forever := time.Duration(math.MaxInt64)
	res, err := s.Claim(ctx, "longest", idempotency.ClaimRequest{Token: "tok", Lease: forever, TTL: forever})
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, s.Renew(ctx, "longest", "tok", forever))
	rec, ttl, _, err := sqlstoretest.Inspect(ctx, s, "longest")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Greater(t, ttl, 2*idempotency.MaxTTL-time.Minute, "the record is kept for its lease and its claim's TTL")
	assert.Greater(t, rec.LeaseExpiresAt.Sub(rec.UpdatedAt), idempotency.MaxTTL-time.Minute)
}
