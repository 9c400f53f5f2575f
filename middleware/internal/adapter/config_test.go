package adapter_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
)

// The sentinels of an adapter.
var errInvalid, errNilStore = errors.New("pkg: invalid config"), errors.New("pkg: nil store")

func TestWithDefaults(t *testing.T) {
	got := adapter.Common{}.WithDefaults("pkg")
	assert.Equal(t, adapter.Common{KeyPrefix: "pkg", MaxKeyLength: adapter.DefaultMaxKeyLength, RetryAfter: adapter.DefaultRetryAfter,
		LeaseTTL: idempotency.DefaultLeaseTTL, StoreTimeout: idempotency.DefaultStoreTimeout,
		CompletedTTL: idempotency.DefaultCompletedTTL, FailedTTL: idempotency.DefaultFailedTTL}, got)
	set := adapter.Common{KeyPrefix: "mine", MaxKeyLength: 9, RetryAfter: 2, LeaseTTL: 3, StoreTimeout: 4, CompletedTTL: 5, FailedTTL: 6}
	assert.Equal(t, set, set.WithDefaults("pkg"), "set values stay")
}

// TestCheck: every problem of the shared settings, in the documented order,
// each matching the adapter's sentinel.
func TestCheck(t *testing.T) {
	c := adapter.Common{Invalid: errInvalid, NilStore: errNilStore, Unit: "call",
		LeaseTTL: time.Millisecond, StoreTimeout: -1, FailedTTL: -2, RetryAfter: -3, MaxKeyLength: -4}
	adaptertest.RequireProblems(t, c.Check().Err(), `pkg: nil store
pkg: invalid config: Scope is required (the tenant of a call); set SingleTenant instead only when one client calls this service
pkg: invalid config: StoreTimeout is -1ns, must not be negative
pkg: invalid config: FailedTTL is -2ns, must not be negative
pkg: invalid config: RetryAfter is -3ns, must not be negative
pkg: invalid config: LeaseTTL 1ms is too short to renew every LeaseTTL/3
pkg: invalid config: MaxKeyLength is -4, must not be negative`, errInvalid, errNilStore)

	c = adapter.Common{Invalid: errInvalid, NilStore: errNilStore, Store: &struct{ idempotency.Store }{}, Scoped: true, SingleTenant: true}
	assert.EqualError(t, c.Check().Err(), "pkg: invalid config: Scope and SingleTenant are both set; choose one")
	c.SingleTenant = false
	assert.NoError(t, c.Check().Err(), "zero settings stand for their defaults")
}
