package mysqlstore_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
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
	req := idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: lease, TTL: ttl}
	res, err := s.Claim(context.Background(), key, req)
	require.NoError(t, err)
	require.True(t, res.Acquired, key)
	return req.Token
}

func TestPurgeDeletesExpiredRowsInBatches(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, table := newTable(t, db)
	const short = 50 * time.Millisecond

	var expired, kept []string
	for i := range 7 {
		k := "completed-expired:" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, claim(t, s, k, time.Minute, time.Minute), []byte("r"), short))
		expired = append(expired, k)
	}
	k := "failed-expired"
	require.NoError(t, s.Fail(ctx, k, claim(t, s, k, time.Minute, time.Minute), short))
	expired = append(expired, k)
	claim(t, s, "lapsed-expired", short, short) // the record goes lease + TTL after the claim
	expired = append(expired, "lapsed-expired")

	for i := range 2 {
		k := "completed-live:" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, claim(t, s, k, time.Minute, time.Minute), []byte("r"), time.Minute))
		kept = append(kept, k)
	}
	claim(t, s, "lapsed-kept", short, time.Minute) // lapsed, but its record outlives the lease
	claim(t, s, "in-progress", time.Minute, time.Minute)
	kept = append(kept, "lapsed-kept", "in-progress")

	time.Sleep(3 * short)
	for _, k := range expired {
		rec, err := s.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateAbsent, rec.State, "%s: an expired row reads absent before any purge", k)
	}
	require.Equal(t, len(expired)+len(kept), rows(t, db, table), "expired rows are still in the table")

	var got []int64
	for {
		n, err := s.Purge(ctx, 4)
		require.NoError(t, err)
		got = append(got, n)
		if n < 4 {
			break
		}
	}
	assert.Equal(t, []int64{4, 4, 1}, got, "9 expired rows in batches of 4")
	assert.Equal(t, len(kept), rows(t, db, table), "only unexpired rows are left")
	for _, k := range kept {
		rec, err := s.Get(ctx, k)
		require.NoError(t, err)
		assert.NotEqual(t, idempotency.StateAbsent, rec.State, "%s is kept", k)
	}
	rec, err := s.Get(ctx, "lapsed-kept")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "a lapsed lease within its TTL is kept, with its attempt")

	n, err := s.Purge(ctx, 4)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left to purge")

	for _, batch := range []int{0, -1} {
		_, err := s.Purge(ctx, batch)
		assert.ErrorIs(t, err, mysqlstore.ErrInvalidBatch, "batch %d", batch)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Purge(cancelled, 4)
	assert.ErrorIs(t, err, context.Canceled)
}

// TestPurgeRacesClaims purges while claims take the same expired rows over:
// every claim starts afresh, and no purge deletes a row a claim revived.
func TestPurgeRacesClaims(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, table := newTable(t, db)
	const keys = 300
	for i := range keys {
		k := "k" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, claim(t, s, k, time.Minute, time.Minute), nil, time.Millisecond))
	}
	time.Sleep(20 * time.Millisecond) // every record has expired

	var stop atomic.Bool
	var purged atomic.Int64
	var purgers, claimers sync.WaitGroup
	for range 4 {
		purgers.Go(func() {
			for !stop.Load() {
				n, err := s.Purge(ctx, 2)
				if !assert.NoError(t, err) {
					return
				}
				purged.Add(n)
			}
		})
	}
	tokens := make([]string, keys)
	next := atomic.Int64{}
	for range 16 {
		claimers.Go(func() {
			for i := int(next.Add(1) - 1); i < keys; i = int(next.Add(1) - 1) {
				req := idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: time.Minute, TTL: time.Minute}
				res, err := s.Claim(ctx, "k"+strconv.Itoa(i), req)
				if assert.NoError(t, err) && assert.True(t, res.Acquired, "an expired key is claimable") {
					assert.Equal(t, 1, res.Record.Attempts, "an expired record no longer counts")
					tokens[i] = req.Token
				}
			}
		})
	}
	claimers.Wait()
	stop.Store(true)
	purgers.Wait()

	for i, tok := range tokens {
		rec, err := s.Get(ctx, "k"+strconv.Itoa(i))
		require.NoError(t, err)
		require.Equal(t, idempotency.StateInProgress, rec.State, "k%d: no purge deleted the revived row", i)
		require.Equal(t, tok, rec.Token, "k%d", i)
	}
	assert.Equal(t, keys, rows(t, db, table))
	t.Logf("purged %d of %d expired rows while they were being claimed", purged.Load(), keys)
}
