package mysqlstore

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// TestDurationMicros: a duration is rounded up to whole microseconds, and
// clamped to idempotency.MaxTTL first, so that "forever"
// (time.Duration(math.MaxInt64)) never rounds over into a negative
// INTERVAL: an expiry in the past, which turns deduplication off on a table
// without the CHECK constraint.
func TestDurationMicros(t *testing.T) {
	maxMicros := int64(idempotency.MaxTTL / time.Microsecond)
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:                      1,
		time.Microsecond:                     1,
		time.Microsecond + 1:                 2,
		40 * time.Second:                     40_000_000,
		idempotency.MaxTTL - time.Nanosecond: maxMicros,
		idempotency.MaxTTL:                   maxMicros,
		idempotency.MaxTTL + time.Nanosecond: maxMicros,
		time.Duration(math.MaxInt64) - 1:     maxMicros,
		time.Duration(math.MaxInt64):         maxMicros,
		time.Duration(math.MaxInt64 - 998):   maxMicros,
	} {
		assert.Equal(t, want, durationMicros(d), "durationMicros(%d)", int64(d))
	}
}
