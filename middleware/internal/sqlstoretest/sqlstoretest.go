// Package sqlstoretest holds the cases that the SQL stores (pgstore,
// mysqlstore) share beyond the store contract that storetest checks: Purge
// of expired rows, in batches and racing claims, DeleteIf and Inspect of
// every state and of a corrupt and an expired row, Records (records.go), and a COMMIT after CompleteInTx that fails, commits, or
// whose answer is lost (commit.go). Each store runs them on a fresh table
// of its own through a Table, or a Commit that says how its consumers book
// a key in a transaction and make its COMMIT fail.
package sqlstoretest

import (
	"context"
	"fmt"
	"iter"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// Store is what the cases use of a SQL store beside idempotency.Store.
type Store interface {
	idempotency.Store
	// Purge deletes up to batch expired rows and returns how many.
	Purge(ctx context.Context, batch int) (int64, error)
	// DeleteIf deletes key's row when its record is in one of states.
	DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error)
	// Records yields the live records under prefix.
	Records(ctx context.Context, prefix string) iter.Seq2[idempotency.Entry, error]
}

// Inspect is key's entry as Records yields it: its record, time to live and
// size, or its Err; an absent or expired key is StateAbsent with zero TTL
// and size, as Get reads it.
func Inspect(ctx context.Context, s Store, key string) (rec idempotency.Record, ttl time.Duration, bytes int64, err error) {
	for e, err := range s.Records(ctx, key) {
		if err != nil {
			return rec, 0, 0, err
		}
		if e.Key == key {
			if e.Err != nil {
				return rec, 0, e.Bytes, e.Err
			}
			return e.Record, e.TTL, e.Bytes, nil
		}
	}
	rec, err = s.Get(ctx, key)
	if err == nil && rec.State != idempotency.StateAbsent {
		err = fmt.Errorf("records did not yield %q, which Get reads %s", key, rec.State)
	}
	return rec, 0, 0, err
}

// Table is a store on a table of its own, fresh for the case.
type Table struct {
	Store Store
	// Rows counts the table's rows, expired ones included.
	Rows func(t *testing.T) int
	// PutCorrupt writes a row under key that is not a record, as a table
	// without the store's CHECK constraint may hold.
	PutCorrupt func(t *testing.T, key string)
	// ErrInvalidBatch is the store's error for a Purge batch that is not
	// positive.
	ErrInvalidBatch error
	// CompleteInTx writes COMPLETED for key's lease of token in a new
	// transaction, left open: end commits or rolls it back.
	CompleteInTx func(t *testing.T, key, token string) (end func(commit bool))
}

// Claim claims key on s with a fresh token, which it returns; the claim
// must acquire.
func Claim(t *testing.T, s idempotency.Store, key string, lease, ttl time.Duration) string {
	t.Helper()
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: ttl}
	res, err := s.Claim(context.Background(), key, req)
	require.NoError(t, err)
	require.True(t, res.Acquired, key)
	return req.Token
}

// PurgeDeletesExpiredRowsInBatches: expired COMPLETED, FAILED and lapsed
// rows read absent before any purge, and Purge deletes them, and only
// them, in batches; a lapsed lease within its TTL is kept with its
// attempt; a batch that is not positive is ErrInvalidBatch, and a
// cancelled context is the context's error.
func PurgeDeletesExpiredRowsInBatches(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	const short = 50 * time.Millisecond

	var expired, kept []string
	for i := range 7 {
		k := "completed-expired:" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, Claim(t, s, k, time.Minute, time.Minute), []byte("r"), short))
		expired = append(expired, k)
	}
	k := "failed-expired"
	require.NoError(t, s.Fail(ctx, k, Claim(t, s, k, time.Minute, time.Minute), short))
	expired = append(expired, k)
	Claim(t, s, "lapsed-expired", short, short) // the record goes lease + TTL after the claim
	expired = append(expired, "lapsed-expired")

	for i := range 2 {
		k := "completed-live:" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, Claim(t, s, k, time.Minute, time.Minute), []byte("r"), time.Minute))
		kept = append(kept, k)
	}
	Claim(t, s, "lapsed-kept", short, time.Minute) // lapsed, but its record outlives the lease
	Claim(t, s, "in-progress", time.Minute, time.Minute)
	kept = append(kept, "lapsed-kept", "in-progress")

	time.Sleep(3 * short)
	for _, k := range expired {
		rec, err := s.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateAbsent, rec.State, "%s: an expired row reads absent before any purge", k)
	}
	require.Equal(t, len(expired)+len(kept), tb.Rows(t), "expired rows are still in the table")

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
	assert.Equal(t, len(kept), tb.Rows(t), "only unexpired rows are left")
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
		assert.ErrorIs(t, err, tb.ErrInvalidBatch, "batch %d", batch)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.Purge(cancelled, 4)
	assert.ErrorIs(t, err, context.Canceled)
}

// PurgeRacesClaims purges while claims take the same expired rows over:
// every claim starts afresh, and no purge deletes a row a claim revived.
func PurgeRacesClaims(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	const keys = 300
	for i := range keys {
		k := "k" + strconv.Itoa(i)
		require.NoError(t, s.Complete(ctx, k, Claim(t, s, k, time.Minute, time.Minute), nil, time.Millisecond))
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
				req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
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
	assert.Equal(t, keys, tb.Rows(t))
	t.Logf("purged %d of %d expired rows while they were being claimed", purged.Load(), keys)
}

// DeleteIf deletes only in the states named and reports what it found; a
// lapsed lease is FAILED; a corrupt row is kept. Inspect reads each state,
// an absent key, the corrupt row and an expired one.
func DeleteIf(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	both := []idempotency.State{idempotency.StateInProgress, idempotency.StateFailed}

	Claim(t, s, "busy", time.Minute, time.Minute)
	found, deleted, err := s.DeleteIf(ctx, "busy", idempotency.StateFailed)
	require.NoError(t, err)
	assert.False(t, deleted, "a live lease is not FAILED")
	assert.Equal(t, idempotency.StateInProgress, found)
	found, deleted, err = s.DeleteIf(ctx, "busy", both...)
	require.NoError(t, err)
	assert.True(t, deleted)
	assert.Equal(t, idempotency.StateInProgress, found)
	assert.Equal(t, 0, tb.Rows(t))

	Claim(t, s, "lapsed", 5*time.Millisecond, time.Minute)
	time.Sleep(20 * time.Millisecond)
	found, deleted, err = s.DeleteIf(ctx, "lapsed", idempotency.StateFailed)
	require.NoError(t, err)
	assert.True(t, deleted)
	assert.Equal(t, idempotency.StateFailed, found)

	tok := Claim(t, s, "done", time.Minute, time.Minute)
	require.NoError(t, s.Complete(ctx, "done", tok, nil, time.Minute))
	found, deleted, err = s.DeleteIf(ctx, "done", both...)
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Equal(t, idempotency.StateCompleted, found)

	found, deleted, err = s.DeleteIf(ctx, "absent", both...)
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Equal(t, idempotency.StateAbsent, found)

	tb.PutCorrupt(t, "bad")
	_, _, err = s.DeleteIf(ctx, "bad", idempotency.StateFailed, idempotency.StateCompleted, idempotency.StateInProgress)
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	assert.Equal(t, 2, tb.Rows(t), "the corrupt row is kept")

	rec, ttl, bytes, err := Inspect(ctx, s, "done")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Greater(t, ttl, 50*time.Second)
	assert.Greater(t, bytes, int64(0))
	rec, _, _, err = Inspect(ctx, s, "absent")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateAbsent, rec.State)
	_, _, _, err = Inspect(ctx, s, "bad")
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)

	tok = Claim(t, s, "expired", time.Minute, time.Minute)
	require.NoError(t, s.Complete(ctx, "expired", tok, nil, 5*time.Millisecond))
	time.Sleep(20 * time.Millisecond)
	rec, ttl, bytes, err = Inspect(ctx, s, "expired")
	require.NoError(t, err)
	assert.Equal(t, idempotency.Record{State: idempotency.StateAbsent}, rec, "an expired row reads absent")
	assert.Zero(t, ttl)
	assert.Zero(t, bytes)
}
