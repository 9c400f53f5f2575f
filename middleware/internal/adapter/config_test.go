package adapter_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// The sentinels of an adapter.
var errInvalid, errNilStore = errors.New("pkg: invalid config"), errors.New("pkg: nil store")

func TestWithDefaults(t *testing.T) {
	got := adapter.Common{}.WithDefaults("pkg")
	assert.Equal(t, adapter.Common{KeyPrefix: "pkg", MaxKeyLength: adapter.DefaultMaxKeyLength, RetryAfter: adapter.DefaultRetryAfter,
		LeaseTTL: idempotency.DefaultLeaseTTL, StoreTimeout: idempotency.DefaultStoreTimeout,
		CompletedTTL: idempotency.DefaultCompletedTTL, FailedTTL: idempotency.DefaultFailedTTL,
		CacheTTL: idempotency.DefaultCacheTTL, CacheMaxBytes: idempotency.DefaultCacheMaxBytes}, got)
	set := adapter.Common{KeyPrefix: "mine", MaxKeyLength: 9, RetryAfter: 2, LeaseTTL: 3, StoreTimeout: 4, CompletedTTL: 5, FailedTTL: 6,
		CacheTTL: 7, CacheMaxBytes: 8, DisableCache: true}
	assert.Equal(t, set, set.WithDefaults("pkg"), "set values stay")
}

// TestCheck: every problem of the shared settings, in the documented order,
// each matching the adapter's sentinel.
func TestCheck(t *testing.T) {
	c := adapter.Common{Invalid: errInvalid, NilStore: errNilStore, Unit: "call",
		LeaseTTL: time.Millisecond, StoreTimeout: -1, FailedTTL: -2, RetryAfter: -3, CacheTTL: -5, MaxKeyLength: -4, CacheMaxBytes: -6}
	adaptertest.RequireProblems(t, c.Check().Err(), `pkg: nil store
pkg: invalid config: Scope is required (the tenant of a call); set SingleTenant instead only when one client calls this service
pkg: invalid config: StoreTimeout is -1ns, must not be negative
pkg: invalid config: FailedTTL is -2ns, must not be negative
pkg: invalid config: RetryAfter is -3ns, must not be negative
pkg: invalid config: CacheTTL is -5ns, must not be negative
pkg: invalid config: LeaseTTL 1ms is too short to renew every LeaseTTL/3
pkg: invalid config: MaxKeyLength is -4, must not be negative
pkg: invalid config: CacheMaxBytes is -6, must not be negative`, errInvalid, errNilStore)

	c = adapter.Common{Invalid: errInvalid, NilStore: errNilStore, Store: &struct{ idempotency.Store }{}, Scoped: true, SingleTenant: true}
	assert.EqualError(t, c.Check().Err(), "pkg: invalid config: Scope and SingleTenant are both set; choose one")
	c.SingleTenant = false
	assert.NoError(t, c.Check().Err(), "zero settings stand for their defaults")
}

// remote hides memstore's in-process mark, so that the owner protocol
// caches its completed keys as it would a networked store's.
type remote struct{ idempotency.Store }

// TestNewOncePassesTheCacheSettings: CacheTTL, CacheMaxBytes and
// DisableCache reach the owner protocol (on synctest's clock).
func TestNewOncePassesTheCacheSettings(t *testing.T) {
	do := func(t *testing.T, once *idempotency.Once) {
		t.Helper()
		_, err := once.Do(context.Background(), "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name         string
		c            adapter.Common
		hits, misses uint64
	}{
		{"defaults", adapter.Common{}, 2, 1},
		{"CacheTTL", adapter.Common{CacheTTL: time.Second}, 1, 2},
		{"CacheMaxBytes", adapter.Common{CacheMaxBytes: 1}, 0, 3},
		{"DisableCache", adapter.Common{DisableCache: true}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := tc.c.WithDefaults("pkg")
				c.Invalid, c.Store = errInvalid, remote{memstore.New(memstore.Config{})}
				once, _, err := c.NewOnce(nil)
				require.NoError(t, err)
				do(t, once)
				do(t, once)
				time.Sleep(time.Second)
				do(t, once)
				st := once.CacheStats()
				assert.Equal(t, tc.hits, st.Hits)
				assert.Equal(t, tc.misses, st.Misses)
			})
		})
	}
}

// TestCheckBoundsTTLsAndPrefix: a lease or TTL beyond idempotency.MaxTTL
// ("forever") and a prefix holding the key separator are invalid: the
// first would overflow a store's expiry into the past, the second would
// let prefix "a:b" with scope "s" store under the key of prefix "a" with a
// scope hashing to "b" (a stored key is prefix:hex(scope):key).
func TestCheckBoundsTTLsAndPrefix(t *testing.T) {
	forever := time.Duration(math.MaxInt64)
	c := adapter.Common{Invalid: errInvalid, NilStore: errNilStore, Store: &struct{ idempotency.Store }{}, Scoped: true,
		LeaseTTL: forever, CompletedTTL: idempotency.MaxTTL + 1, FailedTTL: forever, CacheTTL: forever, KeyPrefix: "tenant:2bd806c97f0e00af1a1fc3328fa763a9"}
	adaptertest.RequireProblems(t, c.Check().Err(), `pkg: invalid config: LeaseTTL is 2562047h47m16.854775807s, must be at most 876000h0m0s (100 years; there is no "no expiry")
pkg: invalid config: CompletedTTL is 876000h0m0.000000001s, must be at most 876000h0m0s (100 years; there is no "no expiry")
pkg: invalid config: FailedTTL is 2562047h47m16.854775807s, must be at most 876000h0m0s (100 years; there is no "no expiry")
pkg: invalid config: CacheTTL is 2562047h47m16.854775807s, must be at most 876000h0m0s (100 years; there is no "no expiry")
pkg: invalid config: KeyPrefix "tenant:2bd806c97f0e00af1a1fc3328fa763a9" holds ":", the separator of prefix:scope:key; use another character ("tenant.2bd806c97f0e00af1a1fc3328fa763a9", say)`, errInvalid, nil)

	c.LeaseTTL, c.CompletedTTL, c.FailedTTL, c.CacheTTL, c.KeyPrefix = idempotency.MaxTTL, idempotency.MaxTTL, idempotency.MaxTTL, idempotency.MaxTTL, "tenant.a/b{c}"
	assert.NoError(t, c.Check().Err(), "MaxTTL and a prefix without a colon are valid")
}
