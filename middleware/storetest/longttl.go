package storetest

import (
	"fmt"
	"math"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// longTTLs are leases and TTLs around idempotency.MaxTTL and up to "forever".
var longTTLs = []time.Duration{
	idempotency.MaxTTL - time.Nanosecond,
	idempotency.MaxTTL,
	idempotency.MaxTTL + time.Nanosecond,
	math.MaxInt64 - time.Millisecond,
	math.MaxInt64,
}

// testLongTTLs: a lease or TTL of MaxTTL or longer holds the key, never
// overflowing into the past.
func testLongTTLs(h *harness) {
	t := h.t
	type keys struct{ lease, claimTTL, completed, failed, leaseTok string }
	all := make([]keys, len(longTTLs))
	for i, d := range longTTLs {
		k := keys{lease: h.key(fmt.Sprintf("lease%d", i)), claimTTL: h.key(fmt.Sprintf("claimttl%d", i)),
			completed: h.key(fmt.Sprintf("completed%d", i)), failed: h.key(fmt.Sprintf("failed%d", i))}

		req := request(nil)
		req.TTL = d
		require.True(t, h.claimWith(k.claimTTL, req).Acquired)
		res := h.claim(k.claimTTL, nil)
		assert.False(t, res.Acquired, "claim TTL %v: a second claim while the first holds the key", d)
		assert.Equal(t, idempotency.StateInProgress, res.Record.State, "claim TTL %v", d)

		req = request(nil)
		req.Lease, req.TTL = d, d
		res = h.claimWith(k.lease, req)
		require.True(t, res.Acquired, "lease %v: a fresh key is acquired", d)
		k.leaseTok = req.Token
		// Never for less than MaxTTL, give or take rounding.
		held := res.Record.LeaseExpiresAt.Sub(res.Record.UpdatedAt)
		assert.GreaterOrEqual(t, held, storekit.ClampTTL(d)-time.Millisecond,
			"lease %v: the claim holds the key for %v", d, held)

		tok := h.mustAcquire(k.completed)
		require.NoError(t, h.Store.Complete(h.ctx, k.completed, tok, []byte("done"), d), "complete with TTL %v", d)
		tok = h.mustAcquire(k.failed)
		require.NoError(t, h.Store.Fail(h.ctx, k.failed, tok, d), "fail with TTL %v", d)
		all[i] = k
	}

	h.advance(past)

	for i, d := range longTTLs {
		k := all[i]
		res := h.claim(k.lease, nil)
		assert.False(t, res.Acquired, "lease %v: a live lease is not claimable", d)
		assert.Equal(t, idempotency.StateInProgress, res.Record.State, "lease %v", d)
		require.NoError(t, h.Store.Renew(h.ctx, k.lease, k.leaseTok, d), "renew with lease %v", d)
		assert.False(t, h.claim(k.lease, nil).Acquired, "lease %v: a renewed lease is not claimable", d)
		require.NoError(t, h.Store.Complete(h.ctx, k.lease, k.leaseTok, nil, d), "the owner of lease %v completes", d)
		assert.Equal(t, idempotency.StateCompleted, h.get(k.lease).State, "lease %v", d)

		h.assertLapsed(h.get(k.claimTTL), 1, fmt.Sprintf("claim TTL %v: the record outlives its lapsed lease", d))
		res = h.claim(k.claimTTL, nil)
		assert.True(t, res.Acquired, "claim TTL %v: a lapsed lease is claimable", d)
		assert.Equal(t, 2, res.Record.Attempts, "claim TTL %v: the lapsed lease counted", d)

		res = h.claim(k.completed, nil)
		assert.False(t, res.Acquired, "completed TTL %v: a completed key is not run again", d)
		assert.Equal(t, idempotency.StateCompleted, res.Record.State, "completed TTL %v", d)
		assert.Equal(t, []byte("done"), res.Record.Result, "completed TTL %v", d)

		rec := h.get(k.failed)
		assert.Equal(t, idempotency.StateFailed, rec.State, "failed TTL %v: the failed attempt is kept", d)
		res = h.claim(k.failed, nil)
		assert.True(t, res.Acquired, "failed TTL %v", d)
		assert.Equal(t, 2, res.Record.Attempts, "failed TTL %v: the failed attempt counts", d)
	}
}

// testLongTTLRelease: a released later attempt stays FAILED for a claim TTL
// of MaxTTL or longer, so its attempts still count.
func testLongTTLRelease(h *harness) {
	t := h.t
	keys := make([]string, len(longTTLs))
	for i, d := range longTTLs {
		k := h.key(fmt.Sprintf("release%d", i))
		keys[i] = k
		req := request(nil)
		req.TTL = d
		require.True(t, h.claimWith(k, req).Acquired)
		require.NoError(t, h.Store.Fail(h.ctx, k, req.Token, d), "fail with TTL %v", d)
		req = request(nil)
		req.TTL = d
		res := h.claimWith(k, req)
		require.True(t, res.Acquired, "claim TTL %v: a failed key is claimed again", d)
		require.Equal(t, 2, res.Record.Attempts)
		require.NoError(t, h.Store.Release(h.ctx, k, req.Token), "release with claim TTL %v", d)
	}

	h.advance(past)

	for i, d := range longTTLs {
		rec := h.get(keys[i])
		assert.Equal(t, idempotency.StateFailed, rec.State, "claim TTL %v: the released attempt's record is kept", d)
		assert.Equal(t, 1, rec.Attempts, "claim TTL %v: the first attempt still counts", d)
		res := h.claim(keys[i], nil)
		assert.True(t, res.Acquired, "claim TTL %v", d)
		assert.Equal(t, 2, res.Record.Attempts, "claim TTL %v: the first attempt still counts", d)
	}
}
