package pgstore_test

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

// TestRecordsLongestTTL: the longest expiry a record can have, a renewal's
// lease plus its claim's TTL at MaxTTL each, is reported by Records as it
// is, not overflowed into a negative duration, and holds the key.
func TestRecordsLongestTTL(t *testing.T) {
	s, _ := newTable(t, testPool(t))
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
	res, err = s.Claim(ctx, "longest", idempotency.ClaimRequest{Token: "other", Lease: time.Second, TTL: time.Hour})
	require.NoError(t, err)
	assert.False(t, res.Acquired)
}
