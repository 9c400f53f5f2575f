package sqlstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMicros: a column of microseconds, as an int64 (binary protocol) or
// as text (text protocol), or NULL, scans into a UTC time, a nil pointer,
// or an error where a time is required.
func TestMicros(t *testing.T) {
	want := time.Date(2026, 12, 1, 9, 30, 0, 123456000, time.UTC)
	for _, src := range []any{want.UnixMicro(), []byte("1796117400123456")} {
		var p *time.Time
		require.NoError(t, Micros{T: &p}.Scan(src))
		require.NotNil(t, p)
		assert.Equal(t, want, *p)
		var at time.Time
		require.NoError(t, Micros{At: &at}.Scan(src))
		assert.Equal(t, want, at)
	}
	p := &want
	require.NoError(t, Micros{T: &p}.Scan(nil))
	assert.Nil(t, p, "NULL leaves no time")
	var at time.Time
	assert.Error(t, Micros{At: &at}.Scan(nil), "NULL where a time is required")
	assert.Error(t, Micros{At: &at}.Scan([]byte("soon")))
}
