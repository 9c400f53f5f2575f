package sqlstoretest

import (
	"context"
	"iter"
	"strconv"
	"strings"
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

// RecordsOddPrefixes: Records selects by the prefix's bytes, exactly: the
// wildcards and escape of SQL's LIKE (% _ \), case, trailing spaces, NUL,
// bytes that are not UTF-8, multi-byte characters and a prefix longer than
// any key mean themselves.
func RecordsOddPrefixes(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	long := strings.Repeat("L", 3000)
	keys := []string{"a%b", "a_b", "axb", "aXb", "A_b", `a\b`, `a\\b`, `a\%b`, "é:1", "e:1",
		"\x00k", "k\x00", "k", "\xff\xfe", "\xff", "t ", "t", "t  ", long, long + "!"}
	for _, k := range keys {
		Claim(t, s, k, time.Minute, time.Minute)
	}
	for _, p := range []string{"a%", "a_", "a", "A", `a\`, `a\\`, `a\%`, "%", "_", "é", "e", "\xc3",
		"\x00", "k", "k\x00", "\xff", "\xff\xfe", "t", "t ", "t  ", "t   ", long, long + "!", long + "!!"} {
		var want []string
		for _, k := range keys {
			if strings.HasPrefix(k, p) {
				want = append(want, k)
			}
		}
		var got []string
		for e, err := range s.Records(ctx, p) {
			require.NoError(t, err, "prefix %q", p)
			require.NoError(t, e.Err, "prefix %q", p)
			got = append(got, e.Key)
		}
		assert.ElementsMatch(t, want, got, "prefix %q", p)
	}
}

// RecordsAcrossPagesWhileChanging: a walk over more than two pages
// yields each record that exists throughout exactly once, however the
// caller's loop inserts and deletes other keys of the prefix meanwhile,
// with the store itself, since no query is open while the loop runs.
func RecordsAcrossPagesWhileChanging(t *testing.T, tb Table) {
	ctx := context.Background()
	s := tb.Store
	const stable = 1100 // three pages of 500
	for i := range stable {
		Claim(t, s, "w:s:"+strconv.Itoa(i), time.Minute, time.Minute)
	}
	for i := range 200 {
		Claim(t, s, "w:v:"+strconv.Itoa(i), time.Minute, time.Minute)
	}
	seen := map[string]int{}
	n := 0
	for e, err := range s.Records(ctx, "w:") {
		require.NoError(t, err)
		require.NoError(t, e.Err)
		seen[e.Key]++
		if n < 200 {
			require.NoError(t, s.Delete(ctx, "w:v:"+strconv.Itoa(n)))
			Claim(t, s, "w:n:"+strconv.Itoa(n), time.Minute, time.Minute)
		}
		n++
	}
	for i := range stable {
		assert.Equal(t, 1, seen["w:s:"+strconv.Itoa(i)], "w:s:%d", i)
	}
	for k, c := range seen {
		assert.Equal(t, 1, c, "%q yielded more than once", k)
	}
}
