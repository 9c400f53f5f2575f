package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// DeleteIf of a live lease whose in-transaction completion is open waits
// for its end: after a commit it finds COMPLETED and keeps it; after a
// rollback it deletes the lease, and the owner's next call finds it lost.
func TestDeleteIfWaitsForAnOpenCompletion(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	ctx := context.Background()
	s, _ := newTable(t, db)
	for _, commit := range []bool{true, false} {
		key := map[bool]string{true: "commit", false: "rollback"}[commit]
		tok := claim(t, s, key, time.Minute, time.Minute)
		tx := begin(t, db, sql.LevelReadCommitted)
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
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
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

// A reserved word, qualified by a database, is a table on the server for
// every statement: the owner's, the in-transaction completion, Records,
// DeleteIf and the purge.
func TestReservedWordTableOnTheServer(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	ctx := context.Background()
	database := uniqueName("mysqlstore_db_")
	_, err := db.ExecContext(ctx, "CREATE DATABASE "+quoted(database))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP DATABASE "+quoted(database)) })
	for _, table := range []string{database + ".order", database + ".select", database + ".key"} {
		s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		require.NoError(t, s.Migrate(ctx), table)
		tok := claim(t, s, "k", time.Minute, time.Minute)
		tx := begin(t, db, sql.LevelReadCommitted)
		require.NoError(t, s.CompleteTx(ctx, tx, "k", tok, []byte("r"), time.Hour), table)
		require.NoError(t, tx.Commit(), table)
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
