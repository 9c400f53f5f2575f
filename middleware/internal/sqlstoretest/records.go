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

// RecordsAndCounts: Records pages through every live record under its
// prefix, whatever the page size; expired rows are skipped and corrupt rows
// carry their Err. The counts by state that idemctl makes of it are exact.
// records is the store's Records with a page size.
func RecordsAndCounts(t *testing.T, tb Table, records func(ctx context.Context, prefix string, batch int) iter.Seq2[idempotency.Entry, error]) {
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

	for _, batch := range []int{1, 3, 500} {
		got := map[string]idempotency.State{}
		corrupt := 0
		for e, err := range records(ctx, "p:", batch) {
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

	byState := map[string]int64{}
	for e, err := range s.Records(ctx, "p:") {
		require.NoError(t, err)
		if e.Err != nil {
			byState["corrupt"]++
			continue
		}
		byState[e.Record.State.String()]++
		assert.Greater(t, e.Bytes, int64(0))
	}
	assert.Equal(t, map[string]int64{"completed": 7, "in_progress": 1, "failed": 1, "corrupt": 1}, byState, "the lapsed lease counts as failed")
}
