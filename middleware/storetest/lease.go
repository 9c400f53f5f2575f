package storetest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// assertLapsed checks that rec reads as a lease that lapsed: FAILED, without
// a token, with its attempts, and with a lease deadline that has passed.
func (h *harness) assertLapsed(rec idempotency.Record, attempts int, what string) {
	h.t.Helper()
	assert.Equal(h.t, idempotency.StateFailed, rec.State, "%s: a lapsed lease reads as FAILED: the attempt failed", what)
	assert.Empty(h.t, rec.Token, "%s: a lapsed lease has no owner", what)
	assert.Equal(h.t, attempts, rec.Attempts, "%s: a lapsed lease keeps its attempts", what)
	assert.Nil(h.t, rec.Result, what)
	require.False(h.t, rec.LeaseExpiresAt.IsZero(), "%s: a lapsed lease keeps its deadline", what)
	assert.False(h.t, rec.LeaseExpiresAt.After(h.storeNow()), "%s: the lapsed deadline %v is past", what, rec.LeaseExpiresAt)
}

func testStaleOwner(h *harness) {
	t, k, k2 := h.t, h.key("k"), h.key("k2")
	stale := h.mustAcquire(k)
	// k2's record must outlive the checks below on a loaded machine.
	req2 := request(nil)
	req2.TTL = time.Minute
	require.True(t, h.claimWith(k2, req2).Acquired)
	lapsed := req2.Token
	h.advance(past)

	fresh := request(nil)
	res := h.claimWith(k, fresh)
	require.True(t, res.Acquired, "a lapsed lease is claimable")
	assert.Equal(t, 2, res.Record.Attempts, "the lapsed lease counted as an attempt")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, stale, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, stale, []byte("stale"), time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, stale, time.Minute), idempotency.ErrLeaseLost)
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a stale owner changes nothing")
	assert.Equal(t, fresh.Token, rec.Token)
	assert.Equal(t, 2, rec.Attempts)
	require.NoError(t, h.Store.Complete(h.ctx, k, fresh.Token, []byte("fresh"), time.Minute))
	assert.Equal(t, []byte("fresh"), h.get(k).Result)

	// A lapsed owner is fenced even if nobody claimed the key again.
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k2, lapsed, nil, time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k2, lapsed, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k2, lapsed, time.Minute), idempotency.ErrLeaseLost)
	h.assertLapsed(h.get(k2), 1, "stale owner's key")
}

func testRenew(h *harness) {
	t, k := h.t, h.key("k")
	// A lease of its own, renewed every quarter: a loaded machine has
	// stalled a renewal past a 300 ms lease.
	const renewLease = time.Second
	req := request(nil)
	req.Lease = renewLease
	require.True(t, h.claimWith(k, req).Acquired)
	tok := req.Token
	for range 9 {
		h.advance(renewLease / 4)
		require.NoError(t, h.Store.Renew(h.ctx, k, tok, renewLease))
	}
	assert.False(t, h.claim(k, nil).Acquired, "a renewed lease is not claimable")
	require.NoError(t, h.Store.Renew(h.ctx, k, tok, 4*renewLease), "renew may lengthen the lease")
	h.advance(renewLease + past - lease)
	assert.False(t, h.claim(k, nil).Acquired, "the lengthened lease holds past the original one")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, "not-the-owner", lease), idempotency.ErrLeaseLost)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute))
}

func testLeaseExpiry(h *harness) {
	t, k := h.t, h.key("k")
	// A record that outlives its lease by far: a late read on a loaded
	// machine still finds the lapsed lease, not an expired record.
	req := request(nil)
	req.TTL = 10 * lease
	require.True(t, h.claimWith(k, req).Acquired)
	h.advance(lease / 3)
	assert.False(t, h.claim(k, nil).Acquired, "a live lease is not claimable")
	h.advance(past - lease/3)
	h.assertLapsed(h.get(k), 1, "lapsed lease")
	res := h.claim(k, nil)
	assert.True(t, res.Acquired, "a lapsed lease is claimable")
	assert.Equal(t, 2, res.Record.Attempts)
}

// testLapsedLease follows two keys on one timeline (times for the real
// clock; each step leaves at least 100ms either side of a deadline):
//
//	  0ms  claim k (attempt 1, lease to 300, record to 600); claim r
//	200ms  renew r (lease to 500)
//	400ms  renew r (lease to 700, record to 1000); k lapsed: FAILED,
//	       claim k (attempt 2, lease to 700, record to 1000)
//	800ms  r lapsed, and still there although its claim's record would
//	       have gone at 600; k lapsed again: claim k (attempt 3, record to 1400)
//	1500ms k and r gone; claim k is attempt 1
func testLapsedLease(h *harness) {
	t, k, r := h.t, h.key("k"), h.key("renewed")
	first := h.claim(k, nil)
	require.True(t, first.Acquired)
	rreq := request(nil)
	claimedR := h.claimWith(r, rreq)
	require.True(t, claimedR.Acquired)

	h.advance(lease * 2 / 3)
	require.NoError(t, h.Store.Renew(h.ctx, r, rreq.Token, lease))
	h.advance(lease * 2 / 3)
	require.NoError(t, h.Store.Renew(h.ctx, r, rreq.Token, lease))

	rec := h.get(k)
	h.assertLapsed(rec, 1, "first lapse")
	h.freshTime(first.Record.LeaseExpiresAt, rec.LeaseExpiresAt, "the lapsed deadline is the claim's")
	h.freshTime(first.Record.CreatedAt, rec.CreatedAt, "the lapsed record keeps its creation time")
	second := h.claim(k, nil)
	require.True(t, second.Acquired, "a lapsed lease is claimable")
	assert.Equal(t, 2, second.Record.Attempts, "the lapsed lease counted as an attempt")
	assert.True(t, second.Record.CreatedAt.Equal(rec.CreatedAt), "a new attempt keeps the record's creation time")
	assert.True(t, second.Record.LeaseExpiresAt.After(rec.LeaseExpiresAt), "a new attempt has a new lease")

	h.advance(past)
	rec = h.get(r)
	h.assertLapsed(rec, 1, "renewed lease, lapsed")
	assert.True(t, rec.LeaseExpiresAt.After(claimedR.Record.LeaseExpiresAt), "renewals moved the deadline")
	rec = h.get(k)
	h.assertLapsed(rec, 2, "second lapse")
	assert.WithinDuration(t, second.Record.LeaseExpiresAt, rec.LeaseExpiresAt, time.Millisecond)
	third := h.claim(k, nil)
	require.True(t, third.Acquired)
	assert.Equal(t, 3, third.Record.Attempts, "every lapsed lease counts: a crash loop reaches MaxAttempts")

	h.advance(lease + ttl + 100*time.Millisecond)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a lapsed record expires TTL after its deadline")
	assert.Equal(t, idempotency.StateAbsent, h.get(r).State, "and so does a renewed one")
	res := h.claim(k, nil)
	require.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts, "attempts restart only when the record itself expired")
}

func testCompletedExpires(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("r"), ttl))
	h.advance(ttl / 3)
	assert.Equal(t, idempotency.StateCompleted, h.get(k).State)
	h.advance(past)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	res := h.claim(k, nil)
	assert.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts)
}

func testFailedExpires(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, ttl))
	h.advance(past)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	res := h.claim(k, nil)
	assert.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts, "an expired FAILED record no longer counts")
}
