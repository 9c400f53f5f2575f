package sqlstoretest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// DeleteIfWaitsForAnOpenCompletion: DeleteIf of a live lease whose
// in-transaction completion is open waits for its end: after a commit it
// finds COMPLETED and keeps it; after a rollback it deletes the lease, and
// the owner's next call finds it lost.
func DeleteIfWaitsForAnOpenCompletion(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	for _, commit := range []bool{true, false} {
		key := map[bool]string{true: "commit", false: "rollback"}[commit]
		tok := Claim(t, s, key, time.Minute, time.Minute)
		end := tb.CompleteInTx(t, key, tok)
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
		end(commit)
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

// PurgeBesideAnOpenCompletion: a purge does not wait for an in-transaction
// completion's open transaction: it deletes the expired rows beside the
// locked one while the transaction is open, and claims of other keys (an
// expired one, a new one) do not queue behind it.
func PurgeBesideAnOpenCompletion(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	for _, k := range []string{"e1", "e2", "e3"} {
		Claim(t, s, k, 20*time.Millisecond, 20*time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	end := tb.CompleteInTx(t, "k", Claim(t, s, "k", time.Minute, time.Minute))

	// On MariaDB a statement that waits for a lock waits on after its
	// context ended, up to innodb_lock_wait_timeout.
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	claims := make(chan time.Duration, 2)
	for _, k := range []string{"e1", "new"} {
		go func() {
			time.Sleep(200 * time.Millisecond) // the purge is running
			start := time.Now()
			_, err := s.Claim(ctx, k, idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Second, TTL: time.Second})
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
	end(true)
	assert.Equal(t, 3, tb.Rows(t), "k, e1 and new")
}

// EveryStatement runs each kind of statement of s once: the owner's, the
// in-transaction completion (tb.CompleteInTx), Records, DeleteIf, the
// purge and Delete, on a table of its own.
func EveryStatement(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	tb.CompleteInTx(t, "k", Claim(t, s, "k", time.Minute, time.Minute))(true)
	Claim(t, s, "gone", 20*time.Millisecond, 20*time.Millisecond)
	Claim(t, s, "busy", time.Minute, time.Minute)
	time.Sleep(50 * time.Millisecond)
	n := 0
	for e, err := range s.Records(ctx, "") {
		require.NoError(t, err)
		require.NoError(t, e.Err)
		n++
	}
	assert.Equal(t, 2, n)
	_, deleted, err := s.DeleteIf(ctx, "busy", idempotency.StateInProgress)
	require.NoError(t, err)
	assert.True(t, deleted)
	purged, err := s.Purge(ctx, 10)
	require.NoError(t, err)
	assert.Equal(t, int64(1), purged)
	require.NoError(t, s.Delete(ctx, "k"))
	assert.Equal(t, 0, tb.Rows(t))
}
