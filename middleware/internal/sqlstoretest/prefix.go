package sqlstoretest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
