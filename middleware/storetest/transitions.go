package storetest

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

func testClaimAbsent(h *harness) {
	t, k := h.t, h.key("k")
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State)
	req := request(nil)
	res := h.claimWith(k, req)
	require.True(t, res.Acquired)
	assert.Equal(t, req.Token, res.Record.Token, "the record carries the claim's own token")
	assert.Equal(t, idempotency.StateInProgress, res.Record.State)
	assert.Equal(t, 1, res.Record.Attempts)
	assert.False(t, res.Record.CreatedAt.IsZero())
	assert.False(t, res.Record.UpdatedAt.Before(res.Record.CreatedAt))
	assert.WithinDuration(t, res.Record.UpdatedAt.Add(lease), res.Record.LeaseExpiresAt, lease/10,
		"the lease ends lease after the claim, by the store's clock")
	assert.True(t, res.Record.LeaseExpiresAt.After(h.storeNow()), "a fresh lease ends in the future")

	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Equal(t, req.Token, rec.Token)
	assert.Equal(t, 1, rec.Attempts)
	assert.Nil(t, rec.Result)
	h.freshTime(res.Record.LeaseExpiresAt, rec.LeaseExpiresAt, "Get reads the claim's deadline")
}

func testClaimRace(h *harness) {
	const claimers, rounds = 64, 100
	for round := range rounds {
		k := h.key("race:" + string(rune('a'+round%26)) + randomHex(4))
		var wins atomic.Int32
		var winner atomic.Value
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, claimers)
		for range claimers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
				<-start
				res, err := h.Store.Claim(h.ctx, k, req)
				if err != nil {
					errs <- err
					return
				}
				if res.Acquired {
					wins.Add(1)
					winner.Store(req.Token)
				} else if res.Record.State != idempotency.StateInProgress || res.Record.Token != "" {
					errs <- errors.New("a refused claim must see IN_PROGRESS without the owner's token")
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(h.t, err)
		}
		require.EqualValues(h.t, 1, wins.Load(), "round %d: exactly one of %d claimers must win", round, claimers)
		require.Equal(h.t, winner.Load(), h.get(k).Token, "round %d: the key is held by the winner's token", round)
	}
}

func testClaimInProgress(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	res := h.claim(k, nil)
	assert.False(t, res.Acquired)
	assert.Equal(t, idempotency.StateInProgress, res.Record.State)
	assert.Empty(t, res.Record.Token, "another owner's token is never handed out by Claim")
	assert.True(t, res.Record.LeaseExpiresAt.After(res.Record.UpdatedAt), "a live lease ends after its claim")
	assert.Equal(t, tok, h.get(k).Token, "a refused claim changes nothing")
}

func testComplete(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Complete(h.ctx, k, tok, []byte("output"), time.Minute))

	rec := h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Empty(t, rec.Token)
	assert.Equal(t, []byte("output"), rec.Result)
	assert.Equal(t, 1, rec.Attempts)
	assert.False(t, rec.UpdatedAt.Before(rec.CreatedAt))
	assert.True(t, rec.LeaseExpiresAt.IsZero(), "a COMPLETED record has no lease")

	res := h.claim(k, nil)
	assert.False(t, res.Acquired, "a COMPLETED key is never claimed again")
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Equal(t, []byte("output"), res.Record.Result, "the duplicate's claim returns the result")

	other := storekit.NewToken()
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, other, []byte("again"), time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, other, time.Minute), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost, "a completed key is not failed, even by its owner")
	// The owner's renewal tells its own completion from a lost lease.
	err := h.Store.Renew(h.ctx, k, tok, time.Minute)
	assert.ErrorIs(t, err, idempotency.ErrCompletedByOwner, "the completing owner's renewal")
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost, "the completing owner's renewal")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, other, time.Minute), idempotency.ErrLeaseLost, "another token's renewal of a completed key")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, []byte("output"), rec.Result, "another Complete changes nothing")
	assert.True(t, rec.LeaseExpiresAt.IsZero(), "a renewal of a completed key changes nothing")
}

func testFailAttempts(h *harness) {
	t, k := h.t, h.key("k")
	for attempt := 1; attempt <= 3; attempt++ {
		req := request(nil)
		res := h.claimWith(k, req)
		require.True(t, res.Acquired, "a FAILED key is claimable (attempt %d)", attempt)
		assert.Equal(t, attempt, res.Record.Attempts)
		require.NoError(t, h.Store.Fail(h.ctx, k, req.Token, time.Minute))
		rec := h.get(k)
		assert.Equal(t, idempotency.StateFailed, rec.State)
		assert.Equal(t, attempt, rec.Attempts)
		assert.Empty(t, rec.Token)
		assert.True(t, rec.LeaseExpiresAt.IsZero(), "a record failed by its owner has no lease")
		assert.ErrorIs(t, h.Store.Renew(h.ctx, k, req.Token, lease), idempotency.ErrLeaseLost, "fail ends the lease")
	}
	req := request(nil)
	require.True(t, h.claimWith(k, req).Acquired)
	require.NoError(t, h.Store.Complete(h.ctx, k, req.Token, []byte("ok"), time.Minute))
	rec := h.get(k)
	assert.Equal(t, 4, rec.Attempts, "attempts survive completion")
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// testResent resends every transition the way a client does when the reply
// of its first try was lost.
func testResent(h *harness) {
	t, k := h.t, h.key("completed")
	req := request(nil)
	first := h.claimWith(k, req)
	require.True(t, first.Acquired)
	h.advance(lease / 3)
	again := h.claimWith(k, req)
	require.True(t, again.Acquired, "a claim resent with the token that holds the key acquires it")
	assert.Equal(t, 1, again.Record.Attempts, "a resent claim counts no attempt")
	h.freshTime(first.Record.CreatedAt, again.Record.CreatedAt, "a resent claim keeps the creation time")
	assert.True(t, again.Record.LeaseExpiresAt.After(first.Record.LeaseExpiresAt), "a resent claim counts its lease from now")
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	assert.Equal(t, req.Token, rec.Token)
	assert.Equal(t, 1, rec.Attempts)

	require.NoError(t, h.Store.Renew(h.ctx, k, req.Token, lease))
	require.NoError(t, h.Store.Renew(h.ctx, k, req.Token, lease), "a resent renewal succeeds")
	require.NoError(t, h.Store.Complete(h.ctx, k, req.Token, []byte("first"), time.Minute))
	require.NoError(t, h.Store.Complete(h.ctx, k, req.Token, []byte("second"), time.Minute),
		"a Complete resent by the owner whose Complete was applied succeeds")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, []byte("first"), rec.Result, "a resent Complete changes nothing")
	assert.Equal(t, 1, rec.Attempts)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, storekit.NewToken(), []byte("other"), time.Minute), idempotency.ErrLeaseLost,
		"only the completing token's resend succeeds")
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, req.Token, time.Minute), idempotency.ErrLeaseLost, "the completing token cannot fail it")
	res := h.claimWith(k, req)
	assert.False(t, res.Acquired, "COMPLETED is terminal, even for a claim with the completing token")
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Empty(t, res.Record.Token)
	assert.Equal(t, []byte("first"), res.Record.Result)
	assert.Equal(t, []byte("first"), h.get(k).Result)

	k = h.key("failed")
	tok := h.mustAcquire(k)
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, time.Minute))
	require.NoError(t, h.Store.Fail(h.ctx, k, tok, time.Minute), "a Fail resent by its owner succeeds")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateFailed, rec.State)
	assert.Equal(t, 1, rec.Attempts)
	assert.Empty(t, rec.Token, "the failing token is never reported")
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, time.Minute), idempotency.ErrLeaseLost, "a failed owner cannot complete")
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, lease), idempotency.ErrLeaseLost)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, storekit.NewToken(), time.Minute), idempotency.ErrLeaseLost, "only the failing token's resend succeeds")
	next := request(nil)
	require.True(t, h.claimWith(k, next).Acquired)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, time.Minute), idempotency.ErrLeaseLost,
		"a Fail resent after the key was claimed again is stale")
	rec = h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "a stale resent Fail changes nothing")
	assert.Equal(t, next.Token, rec.Token)
	assert.Equal(t, 2, rec.Attempts)

	// The token that failed a key holds nothing: its own claim is a new
	// attempt, not a resend.
	k = h.key("reclaimed")
	req = request(nil)
	require.True(t, h.claimWith(k, req).Acquired)
	require.NoError(t, h.Store.Fail(h.ctx, k, req.Token, time.Minute))
	res = h.claimWith(k, req)
	require.True(t, res.Acquired, "a FAILED key is claimable")
	assert.Equal(t, 2, res.Record.Attempts, "a claim of a FAILED key counts an attempt, whatever its token")
}
