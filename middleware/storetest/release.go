package storetest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// testRelease undoes claims whose outcome their caller never learned: the
// key goes back to what the claim found, and only a live lease of the
// releasing token is undone.
func testRelease(h *harness) {
	t := h.t
	assert.NoError(t, h.Store.Release(h.ctx, h.key("absent"), storekit.NewToken()), "releasing an absent key is a no-op")
	assert.Equal(t, idempotency.StateAbsent, h.get(h.key("absent")).State)

	// A first attempt released: the key is gone, as the claim found it.
	k := h.key("first")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Release(h.ctx, k, storekit.NewToken()), "another token's Release is a no-op")
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "another token's Release changes nothing")
	assert.Equal(t, tok, rec.Token)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a released first attempt leaves no record")
	require.NoError(t, h.Store.Release(h.ctx, k, tok), "a resent Release succeeds")
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, []byte("late"), time.Minute), idempotency.ErrLeaseLost,
		"the released owner holds nothing")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost)
	next := request(nil)
	res := h.claimWith(k, next)
	require.True(t, res.Acquired)
	assert.Equal(t, 1, res.Record.Attempts, "the released claim counted no attempt")
	require.NoError(t, h.Store.Release(h.ctx, k, tok), "a Release resent after the key was claimed again is a no-op")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a stale Release changes nothing")
	assert.Equal(t, next.Token, rec.Token)

	// A later attempt released: FAILED again, with the attempts it had.
	k = h.key("failed")
	failer := request([]byte("fp"))
	first := h.claimWith(k, failer)
	require.True(t, first.Acquired)
	require.NoError(t, h.Store.Fail(h.ctx, k, failer.Token, time.Minute))
	tok = h.mustAcquire(k)
	require.Equal(t, 2, h.get(k).Attempts)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	rec = h.get(k)
	assert.Equal(t, idempotency.StateFailed, rec.State, "a released later attempt is FAILED again")
	assert.Equal(t, 1, rec.Attempts, "the released claim counted no attempt")
	assert.Empty(t, rec.Token)
	assert.True(t, rec.LeaseExpiresAt.IsZero(), "a released claim leaves no lease")
	h.freshTime(first.Record.CreatedAt, rec.CreatedAt, "the record keeps its creation time")
	assert.Equal(t, []byte("fp"), rec.Fingerprint, "and its fingerprint")
	require.NoError(t, h.Store.Release(h.ctx, k, tok), "a resent Release succeeds")
	require.NoError(t, h.Store.Release(h.ctx, k, storekit.NewToken()), "another token's Release of a FAILED key is a no-op")
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), idempotency.ErrLeaseLost, "the released owner holds nothing")
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost, "the released owner cannot fail")
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, failer.Token, time.Minute), idempotency.ErrLeaseLost,
		"the key was claimed since the first Fail: its resend is stale")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateFailed, rec.State, "none of them changed anything")
	assert.Equal(t, 1, rec.Attempts)
	res = h.claim(k, nil)
	require.True(t, res.Acquired, "a released key is claimable again")
	assert.Equal(t, 2, res.Record.Attempts, "as the attempt the released claim was")

	// A COMPLETED key is never released, even by the token that completed it.
	k = h.key("completed")
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("done"), time.Minute))
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	rec = h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State, "Release of a COMPLETED key changes nothing")
	assert.Equal(t, []byte("done"), rec.Result)

	// A lease that lapsed is not released: its attempt ran, or may have.
	k = h.key("lapsed")
	tok = h.mustAcquire(k)
	h.advance(past)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	h.assertLapsed(h.get(k), 1, "released after its lease lapsed")
	res = h.claim(k, nil)
	require.True(t, res.Acquired)
	assert.Equal(t, 2, res.Record.Attempts, "the lapsed attempt still counts")

	// A released later attempt is kept for its claim's TTL from the release.
	k = h.key("expires")
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, time.Minute))
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Release(h.ctx, k, tok))
	require.Equal(t, idempotency.StateFailed, h.get(k).State)
	h.advance(past)
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a released record expires the claim's TTL after the release")
}

func testDelete(h *harness) {
	t, k := h.t, h.key("k")
	require.NoError(t, h.Store.Delete(h.ctx, k), "deleting an absent key is fine")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Delete(h.ctx, k))
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), idempotency.ErrLeaseLost)
	tok = h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute))
	require.NoError(t, h.Store.Delete(h.ctx, k))
	assert.True(t, h.claim(k, nil).Acquired, "a deleted COMPLETED key starts afresh")
}
