package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// DeleteIf of a live lease whose in-transaction completion is open waits
// for its end: after a commit it finds COMPLETED and keeps it; after a
// rollback it deletes the lease, and the owner's next call finds it lost.
func TestDeleteIfWaitsForAnOpenCompletion(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := context.Background()
	s, _ := newTable(t, pool)
	for _, commit := range []bool{true, false} {
		key := map[bool]string{true: "commit", false: "rollback"}[commit]
		tok := claim(t, s, key, time.Minute, time.Minute)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, s.CompleteTx(ctx, tx, key, tok, []byte("r"), time.Hour))
		type answer struct {
			found   idempotency.State
			deleted bool
			err     error
		}
		done := make(chan answer, 1)
		go func() {
			found, deleted, err := s.DeleteIf(ctx, key, idempotency.StateInProgress)
			done <- answer{found, deleted, err}
		}()
		select {
		case a := <-done:
			t.Fatalf("%s: DeleteIf went past the open completion: %+v", key, a)
		case <-time.After(200 * time.Millisecond):
		}
		if commit {
			require.NoError(t, tx.Commit(ctx))
		} else {
			require.NoError(t, tx.Rollback(ctx))
		}
		a := <-done
		require.NoError(t, a.err, key)
		if commit {
			assert.False(t, a.deleted, "a COMPLETED key is not IN_PROGRESS")
			assert.Equal(t, idempotency.StateCompleted, a.found)
			rec, err := s.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateCompleted, rec.State)
		} else {
			assert.True(t, a.deleted, "the rolled-back completion left the live lease")
			assert.Equal(t, idempotency.StateInProgress, a.found)
			assert.ErrorIs(t, s.Renew(ctx, key, tok, time.Minute), idempotency.ErrLeaseLost)
		}
	}
}

// A purge does not wait for a completion's open transaction: it deletes
// the expired rows beside the locked one, and claims of other keys do not
// queue behind it.
func TestPurgeBesideAnOpenCompletion(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := context.Background()
	s, table := newTable(t, pool)
	for _, k := range []string{"e1", "e2", "e3"} {
		claim(t, s, k, 20*time.Millisecond, 20*time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	tok := claim(t, s, "k", time.Minute, time.Minute)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Hour))

	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	n, err := s.Purge(pctx, 100)
	require.NoError(t, err, "after %s", time.Since(start))
	assert.Equal(t, int64(3), n)
	for _, k := range []string{"e1", "new"} {
		start := time.Now()
		_, err := s.Claim(pctx, k, idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: time.Second, TTL: time.Second})
		require.NoError(t, err, k)
		assert.Less(t, time.Since(start), time.Second, k)
	}
	require.NoError(t, tx.Commit(ctx))
	assert.Equal(t, 3, rows(t, pool, table), "k, e1 and new")
}

// A reserved word, qualified by a schema, is a table on the server for
// every statement: the owner's, the in-transaction completion, Records,
// DeleteIf and the purge.
func TestReservedWordTableOnTheServer(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := context.Background()
	schema := uniqueName("pgstore_schema_")
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+quoted(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+quoted(schema)+" CASCADE") })
	for _, table := range []string{schema + ".order", schema + ".select", schema + ".user"} {
		s, err := pgstore.New(pool, pgstore.Config{Table: table})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx), table)
		tok := claim(t, s, "k", time.Minute, time.Minute)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return s.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Hour)
		}), table)
		claim(t, s, "gone", 20*time.Millisecond, 20*time.Millisecond)
		claim(t, s, "busy", time.Minute, time.Minute)
		time.Sleep(50 * time.Millisecond)
		n := 0
		for e, err := range s.Records(ctx, "") {
			require.NoError(t, err, table)
			require.NoError(t, e.Err, table)
			n++
		}
		assert.Equal(t, 2, n, table)
		_, deleted, err := s.DeleteIf(ctx, "busy", idempotency.StateInProgress)
		require.NoError(t, err, table)
		assert.True(t, deleted, table)
		purged, err := s.Purge(ctx, 10)
		require.NoError(t, err, table)
		assert.Equal(t, int64(1), purged, table)
		require.NoError(t, s.Delete(ctx, "k"), table)
	}
}
