package redisstore

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// TestMillis: a duration is rounded up to whole milliseconds, and clamped to
// idempotency.MaxTTL first, so that "forever" (time.Duration(math.MaxInt64))
// never rounds over into a negative PEXPIRE, which deletes the key, or a
// SET PX error.
func TestMillis(t *testing.T) {
	maxMillis := int64(idempotency.MaxTTL / time.Millisecond)
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:                          1,
		time.Millisecond:                         1,
		time.Millisecond + 1:                     2,
		40 * time.Second:                         40000,
		idempotency.MaxTTL - time.Nanosecond:     maxMillis,
		idempotency.MaxTTL:                       maxMillis,
		idempotency.MaxTTL + time.Nanosecond:     maxMillis,
		time.Duration(math.MaxInt64) - 1:         maxMillis,
		time.Duration(math.MaxInt64):             maxMillis,
		time.Duration(math.MaxInt64 / 2):         maxMillis,
		time.Duration(math.MaxInt64 - 999_999):   maxMillis,
		time.Duration(math.MaxInt64 - 1_000_000): maxMillis,
	} {
		assert.Equal(t, want, millis(d), "millis(%d)", int64(d))
	}
}
