package sqlstoretest

import (
	"context"
	"iter"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Entry is the shape of the stores' Entry, one record found by Records.
type Entry = struct {
	Key    string
	Record idempotency.Record
	TTL    time.Duration
	Bytes  int64
	Err    error
}

// StateCount is the shape of the stores' StateCount, one state's line of
// Counts.
type StateCount = struct {
	Records   int64
	MeanBytes int64
}

// RecordsAndCounts: Records pages through every live record under its
// prefix, whatever the page size; expired rows are skipped and corrupt rows
// carry their Err. Counts agrees with it, corrupt rows under countCorrupt.
// records and counts are the store's Records and Counts, whose Entry and
// StateCount have the shapes above.
func RecordsAndCounts[E ~Entry, C ~StateCount](t *testing.T, tb Table,
	records func(ctx context.Context, prefix string, batch int) iter.Seq2[E, error],
	counts func(ctx context.Context, prefix string) (map[string]C, error), countCorrupt string) {
	ctx := context.Background()
	s := tb.Store
	want := map[string]idempotency.State{}
	for i := range 7 {
		key := "p:done:" + strconv.Itoa(i)
		tok := Claim(t, s, key, time.Minute, time.Minute)
		require.NoError(t, s.Complete(ctx, key, tok, []byte("result"), time.Hour))
		want[key] = idempotency.StateCompleted
	}
	Claim(t, s, "p:busy", time.Minute, time.Minute)
	want["p:busy"] = idempotency.StateInProgress
	Claim(t, s, "p:lapsed", 5*time.Millisecond, time.Minute)
	want["p:lapsed"] = idempotency.StateFailed
	Claim(t, s, "p:gone", 5*time.Millisecond, 5*time.Millisecond) // expires at once
	Claim(t, s, "other:x", time.Minute, time.Minute)
	tb.PutCorrupt(t, "p:bad")
	time.Sleep(30 * time.Millisecond)

	for _, batch := range []int{1, 3, 0} {
		got := map[string]idempotency.State{}
		corrupt := 0
		for raw, err := range records(ctx, "p:", batch) {
			require.NoError(t, err)
			e := Entry(raw)
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

	found, err := counts(ctx, "p:")
	require.NoError(t, err)
	byState := map[string]StateCount{}
	for st, c := range found {
		byState[st] = StateCount(c)
	}
	assert.Equal(t, int64(7), byState["completed"].Records)
	assert.Equal(t, int64(1), byState["in_progress"].Records)
	assert.Equal(t, int64(1), byState["failed"].Records, "the lapsed lease")
	assert.Equal(t, int64(1), byState[countCorrupt].Records)
	assert.Greater(t, byState["completed"].MeanBytes, int64(0))
	assert.Len(t, byState, 4)
}
