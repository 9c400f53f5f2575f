package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// A purge does not wait for a completion's open transaction: it deletes
// the expired rows beside the locked one while the transaction is open,
// and claims of other keys (new ones, expired ones) never queue behind a
// purge that waits for it.
func TestPurgeBesideAnOpenCompletion(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, table := newTable(t, db)
	for _, k := range []string{"e1", "e2", "e3"} {
		claim(t, s, k, 20*time.Millisecond, 20*time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	tok := claim(t, s, "k", time.Minute, time.Minute)
	tx := begin(t, db, sql.LevelReadCommitted)
	require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Hour))

	pctx, cancel := context.WithTimeout(ctx, 3*time.Second) // the server waits on, up to innodb_lock_wait_timeout
	defer cancel()
	claims := make(chan time.Duration, 2)
	for _, k := range []string{"e1", "new"} {
		go func() {
			time.Sleep(200 * time.Millisecond) // the purge is running
			start := time.Now()
			_, err := s.Claim(ctx, k, idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: time.Second, TTL: time.Second})
			assert.NoError(t, err, k)
			claims <- time.Since(start)
		}()
	}
	start := time.Now()
	n, err := s.Purge(pctx, 100)
	for range 2 {
		assert.Less(t, <-claims, time.Second, "a claim queued behind the purge")
	}
	require.NoError(t, err, "after %s", time.Since(start))
	assert.GreaterOrEqual(t, n, int64(2), "the expired rows beside the locked one")
	assert.Less(t, time.Since(start), time.Second)
	require.NoError(t, tx.Commit())
	assert.Equal(t, 3, rows(t, db, table), "k, e1 and new")
}
