package httpidem

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name, in      string
		want          time.Duration
		ok, tooLong   bool
		headerMissing bool
	}{
		{name: "absent", headerMissing: true},
		{name: "empty", in: ""},
		{name: "seconds", in: "3", want: 3 * time.Second, ok: true},
		{name: "zero", in: "0", ok: true},
		{name: "leading zeros", in: "007", want: 7 * time.Second, ok: true},
		{name: "negative", in: "-5"},
		{name: "plus sign", in: "+5"},
		{name: "fraction", in: "1.5"},
		{name: "garbage", in: "soon"},
		{name: "spaces inside", in: "1 0"},
		{name: "largest seconds", in: "9223372036", want: 9223372036 * time.Second, ok: true},
		{name: "seconds overflow a Duration", in: "9223372037", tooLong: true},
		{name: "seconds overflow an int64", in: "99999999999999999999999", tooLong: true},
		{name: "IMF-fixdate", in: "Tue, 01 Dec 2026 10:00:30 GMT", want: 30 * time.Second, ok: true},
		{name: "RFC 850 date", in: "Tuesday, 01-Dec-26 10:01:00 GMT", want: time.Minute, ok: true},
		{name: "asctime date", in: "Tue Dec  1 10:00:05 2026", want: 5 * time.Second, ok: true},
		{name: "date in the past", in: "Tue, 01 Dec 2026 09:00:00 GMT", ok: true},
		{name: "date not GMT", in: "Tue, 01 Dec 2026 10:00:30 +0100"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			if !c.headerMissing {
				h["Retry-After"] = []string{c.in}
			}
			d, ok, tooLong := retryAfter(h, now)
			assert.Equal(t, c.want, d)
			assert.Equal(t, c.ok, ok, "ok")
			assert.Equal(t, c.tooLong, tooLong, "tooLong")
		})
	}
	t.Run("first value counts", func(t *testing.T) {
		d, ok, _ := retryAfter(http.Header{"Retry-After": {"2", "60"}}, now)
		assert.True(t, ok)
		assert.Equal(t, 2*time.Second, d)
	})
}

func TestBackoff(t *testing.T) {
	tr := &transportConfig{backoff: 100 * time.Millisecond, maxWait: time.Second}
	steps := map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		4: 800 * time.Millisecond, 5: time.Second, 40: time.Second, 64: time.Second, 1 << 20: time.Second}
	for n, step := range steps {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := tr.pause(n)
			require.GreaterOrEqual(t, d, step/2, "retry %d", n)
			require.LessOrEqual(t, d, step, "retry %d", n)
			seen[d] = true
		}
		assert.Greater(t, len(seen), 10, "retry %d: the pauses are jittered", n)
	}

	huge := &transportConfig{backoff: time.Duration(1 << 62), maxWait: time.Duration(1<<63 - 1)}
	for _, n := range []int{1, 2, 3, 70} {
		assert.Positive(t, huge.pause(n), "retry %d: no overflow", n)
	}
}

func TestRetryableStatus(t *testing.T) {
	retried := map[int]bool{429: true, 500: true, 502: true, 503: true, 504: true, 507: true, 599: true}
	for _, s := range []int{200, 201, 204, 301, 304, 400, 401, 403, 404, 409, 410, 412, 413, 422, 425, 429, 500, 501, 502, 503, 504, 505, 507, 599, 600} {
		assert.Equal(t, retried[s], retryableStatus(&http.Response{StatusCode: s, Header: http.Header{}}), "status %d", s)
	}
	assert.True(t, retryableStatus(&http.Response{StatusCode: 409, Header: http.Header{"Retry-After": {"1"}}}),
		"409 with Retry-After: the first request still runs")
	assert.True(t, retryableStatus(&http.Response{StatusCode: 409, Header: http.Header{"Retry-After": {"soon"}}}),
		"409 with an unreadable Retry-After still asks for a retry")
}

func TestIdempotentMethod(t *testing.T) {
	for _, m := range []string{"", "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"} {
		assert.True(t, idempotentMethod(m), m)
	}
	for _, m := range []string{"POST", "PATCH", "CONNECT", "get", "CHARGE"} {
		assert.False(t, idempotentMethod(m), m)
	}
}
