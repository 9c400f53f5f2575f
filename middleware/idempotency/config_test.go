package idempotency_test

import (
	"context"
	"fmt"
	"math"
	"strings"
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
	} {
		for _, d := range []time.Duration{idempotency.MaxTTL + time.Nanosecond, forever} {
			oc := idempotency.OnceConfig{Store: store}
			set(&oc, d)
			err := validate(oc)
			require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "OnceConfig.%s %v", name, d)
			assert.ErrorContains(t, err, name+" is "+d.String()+", must be at most 876000h0m0s")
			_, err = idempotency.NewOnce(oc)
			assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "NewOnce with %s %v", name, d)

			c := testConfig{Store: store, LeaseTTL: oc.LeaseTTL, CompletedTTL: oc.CompletedTTL,
				FailedTTL: oc.FailedTTL}
			assert.ErrorIs(t, c.Validate(), idempotency.ErrInvalidConfig, "Config.%s %v", name, d)
			_, err = newMiddleware(c, nil)
			assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "New with %s %v", name, d)
		}
		oc := idempotency.OnceConfig{Store: store}
		set(&oc, idempotency.MaxTTL)
		assert.NoError(t, validate(oc), "%s of MaxTTL", name)
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
	idem, obs := newIdem(t, testConfig{Store: store, LeaseTTL: idempotency.MaxTTL,
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
		cfg := testConfig{Store: store, KeyPrefix: prefix, Scope: scope("charge")}
		err := cfg.Validate()
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "prefix %q", prefix)
		assert.ErrorContains(t, err, "the separator of prefix:scope:key")
		_, err = newMiddleware(cfg, nil)
		assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "prefix %q", prefix)
	}

	billing, _ := newIdem(t, testConfig{Store: store, KeyPrefix: "shop.billing", Scope: scope("charge")})
	shop, shopObs := newIdem(t, testConfig{Store: store, KeyPrefix: "shop", Scope: scope("billing")})
	h := &counter{}
	_, err := billing.Middleware(h.handle)(newMsg("order-7", "a"))
	require.NoError(t, err)
	_, err = shop.Middleware(h.handle)(newMsg("charge:order-7", "b"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load(), "two pairs, two runs")
	assert.Equal(t, 0, shopObs.get(idempotency.OutcomeDuplicate))

	// A scope may hold the separator: it is escaped.
	odd, _ := newIdem(t, testConfig{Store: store, KeyPrefix: "shop", Scope: scope("billing:charge")})
	_, err = odd.Middleware(h.handle)(newMsg("order-7", "c"))
	require.NoError(t, err)
	assert.EqualValues(t, 3, h.runs.Load(), "scope billing:charge is not prefix shop:billing with scope charge")
}

// TestMaxTTLOnEveryStore runs the middleware with a lease and TTLs of
// MaxTTL on memstore and on Redis: a failed run is kept, a running key
// refuses a second copy, a completed one is a duplicate. (pgstore runs the
// same in its own package.)
func TestMaxTTLOnEveryStore(t *testing.T) {
	t.Parallel()
	redis, prefix := sharedRedisStore(t)
	for name, tc := range map[string]struct {
		store  idempotency.Store
		prefix string
	}{
		"memstore": {memstore.New(memstore.Config{}), ""},
		"redis":    {redis, prefix},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runMaxTTLScenario(t, tc.store, tc.prefix)
		})
	}
}

// runMaxTTLScenario is TestMaxTTLOnEveryStore's scenario on one store.
func runMaxTTLScenario(t *testing.T, store idempotency.Store, prefix string) {
	t.Helper()
	idem, obs := newIdem(t, testConfig{Store: store, KeyPrefix: prefix, CacheMaxBytes: -1,
		LeaseTTL: idempotency.MaxTTL, CompletedTTL: idempotency.MaxTTL, FailedTTL: idempotency.MaxTTL})
	h := &counter{block: make(chan struct{})}
	h.failFor.Store(1)
	handler := idem.Middleware(h.handle)
	msg := newMsg("forever", "p")
	key, err := idem.StoreKey(msg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Delete(context.Background(), key) })

	_, err = handler(msg)
	require.ErrorIs(t, err, errHandler)
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State, "the failed attempt is kept")

	done := make(chan error, 1)
	go func() { _, err := handler(newMsg("forever", "p")); done <- err }()
	require.Eventually(t, func() bool { return h.runs.Load() == 2 }, 10*time.Second, time.Millisecond)
	rec, err = store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Greater(t, time.Until(rec.LeaseExpiresAt), idempotency.MaxTTL-time.Hour, "the lease runs for MaxTTL")
	_, err = handler(newMsg("forever", "p"))
	assert.ErrorIs(t, err, idempotency.ErrInProgress, "a live MaxTTL lease is not claimable")
	close(h.block)
	require.NoError(t, <-done)
	_, err = handler(newMsg("forever", "p"))
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.runs.Load(), "failed once, ran once more, then a duplicate")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeDuplicate))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeInProgress))
}

// TestStoredKeysNeverCollide: over every prefix, scope and key of up to a
// few bytes from an alphabet of separators and the bytes of their escapes,
// a prefix with a colon is refused, and no two (prefix, scope, key)
// triples of the others share a stored key.
func TestStoredKeysNeverCollide(t *testing.T) {
	t.Parallel()
	const alphabet = ":%3A5"
	var words func(n int) []string
	words = func(n int) []string {
		if n == 0 {
			return []string{""}
		}
		var out []string
		for _, w := range words(n - 1) {
			for _, c := range alphabet {
				out = append(out, w+string(c))
			}
		}
		return out
	}
	upTo := func(min, max int) []string {
		var out []string
		for n := min; n <= max; n++ {
			out = append(out, words(n)...)
		}
		return out
	}
	prefixes, scopes, keys := upTo(1, 2), upTo(0, 3), upTo(1, 2)
	store := memstore.New(memstore.Config{})
	seen := make(map[string]string, len(prefixes)*len(scopes)*len(keys))
	accepted := 0
	for _, p := range prefixes {
		idem, err := newMiddleware(testConfig{Store: store, KeyPrefix: p,
			Scope: func(m *message.Message) string { return m.Metadata.Get("scope") }}, nil)
		if strings.Contains(p, ":") {
			require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "prefix %q", p)
			continue
		}
		require.NoError(t, err)
		accepted++
		for _, s := range scopes {
			for _, k := range keys {
				msg := newMsg(k, "")
				msg.Metadata.Set("scope", s)
				stored, err := idem.StoreKey(msg)
				require.NoError(t, err)
				triple := fmt.Sprintf("%q %q %q", p, s, k)
				if other, ok := seen[stored]; ok {
					t.Fatalf("%s and %s are both stored as %q", other, triple, stored)
				}
				seen[stored] = triple
			}
		}
	}
	assert.Equal(t, 20, accepted, "the prefixes without a colon")
	assert.Len(t, seen, accepted*len(scopes)*len(keys))
}
