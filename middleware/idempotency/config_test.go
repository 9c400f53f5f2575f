package idempotency_test

import (
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestTTLsAreBounded: a "forever" lease or TTL (time.Duration(math.MaxInt64))
// is an invalid config, not a TTL that overflows a store's arithmetic into
// an expiry in the past; MaxTTL itself is accepted.
func TestTTLsAreBounded(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.Config{})
	forever := time.Duration(math.MaxInt64)
	for name, set := range map[string]func(c *idempotency.OnceConfig, d time.Duration){
		"LeaseTTL":     func(c *idempotency.OnceConfig, d time.Duration) { c.LeaseTTL = d },
		"CompletedTTL": func(c *idempotency.OnceConfig, d time.Duration) { c.CompletedTTL = d },
		"FailedTTL":    func(c *idempotency.OnceConfig, d time.Duration) { c.FailedTTL = d },
		"CacheTTL":     func(c *idempotency.OnceConfig, d time.Duration) { c.CacheTTL = d },
	} {
		for _, d := range []time.Duration{idempotency.MaxTTL + time.Nanosecond, forever} {
			oc := idempotency.OnceConfig{Store: store}
			set(&oc, d)
			err := oc.Validate()
			require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "OnceConfig.%s %v", name, d)
			assert.ErrorContains(t, err, name+" is "+d.String()+", must be at most 876000h0m0s")
			_, err = idempotency.NewOnce(oc, nil)
			assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "NewOnce with %s %v", name, d)

			c := idempotency.Config{Store: store, LeaseTTL: oc.LeaseTTL, CompletedTTL: oc.CompletedTTL,
				FailedTTL: oc.FailedTTL, CacheTTL: oc.CacheTTL}
			assert.ErrorIs(t, c.Validate(), idempotency.ErrInvalidConfig, "Config.%s %v", name, d)
			_, err = idempotency.New(c, nil)
			assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "New with %s %v", name, d)
		}
		oc := idempotency.OnceConfig{Store: store}
		set(&oc, idempotency.MaxTTL)
		assert.NoError(t, oc.Validate(), "%s of MaxTTL", name)
	}
	assert.Equal(t, 100*365*24*time.Hour, idempotency.MaxTTL)
}

// TestMaxTTLKeepsTheKey: the middleware on MaxTTL leases and TTLs runs a
// key once, fails it for the next copy, and completes it for good; on a
// memstore, whose deadlines it adds to its own clock.
func TestMaxTTLKeepsTheKey(t *testing.T) {
	t.Parallel()
	now := time.Now()
	store := memstore.New(memstore.Config{Now: func() time.Time { return now }})
	idem, obs := newIdem(t, idempotency.Config{Store: store, LeaseTTL: idempotency.MaxTTL,
		CompletedTTL: idempotency.MaxTTL, FailedTTL: idempotency.MaxTTL})
	h := &counter{}
	h.failFor.Store(1)
	handler := idem.Middleware(h.handle)
	_, err := handler(newMsg("k", "p"))
	require.ErrorIs(t, err, errHandler)
	now = now.Add(50 * 365 * 24 * time.Hour)
	_, err = handler(newMsg("k", "p"))
	require.NoError(t, err)
	rec, err := store.Get(t.Context(), "idem::k")
	require.NoError(t, err)
	assert.Equal(t, 2, rec.Attempts, "the failed attempt was kept for 50 years")
	now = now.Add(50*365*24*time.Hour - time.Second)
	_, err = handler(newMsg("k", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load(), "completed for MaxTTL: the third copy is a duplicate")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate))
}

// TestKeyPrefixHoldsNoSeparator: the stored key is prefix:scope:key, so a
// colon in the prefix would store prefix "shop:billing", scope "charge",
// key "order-7" under the key of prefix "shop", scope "billing", key
// "charge:order-7", and one would be acked as the other's duplicate. Such
// a prefix is an invalid config; another separator keeps the pairs apart.
func TestKeyPrefixHoldsNoSeparator(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.Config{})
	scope := func(s string) func(*message.Message) string { return func(*message.Message) string { return s } }

	for _, prefix := range []string{"shop:billing", "shop:", ":", "a:b:c"} {
		cfg := idempotency.Config{Store: store, KeyPrefix: prefix, Scope: scope("charge")}
		err := cfg.Validate()
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "prefix %q", prefix)
		assert.ErrorContains(t, err, "the separator of prefix:scope:key")
		_, err = idempotency.New(cfg, nil)
		assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "prefix %q", prefix)
	}

	billing, _ := newIdem(t, idempotency.Config{Store: store, KeyPrefix: "shop.billing", Scope: scope("charge")})
	shop, shopObs := newIdem(t, idempotency.Config{Store: store, KeyPrefix: "shop", Scope: scope("billing")})
	h := &counter{}
	_, err := billing.Middleware(h.handle)(newMsg("order-7", "a"))
	require.NoError(t, err)
	_, err = shop.Middleware(h.handle)(newMsg("charge:order-7", "b"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load(), "two pairs, two runs")
	assert.Equal(t, 0, shopObs.get(idempotency.OutcomeDuplicate))

	// A scope may hold the separator: it is escaped.
	odd, _ := newIdem(t, idempotency.Config{Store: store, KeyPrefix: "shop", Scope: scope("billing:charge")})
	_, err = odd.Middleware(h.handle)(newMsg("order-7", "c"))
	require.NoError(t, err)
	assert.EqualValues(t, 3, h.runs.Load(), "scope billing:charge is not prefix shop:billing with scope charge")
}
