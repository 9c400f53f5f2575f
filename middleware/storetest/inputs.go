package storetest

import (
	"context"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// testCorrupt puts values that are not records under keys and checks that
// every method refuses them with ErrCorruptRecord naming the key: never a
// duplicate, never an overwrite, never a panic; Delete clears them.
func testCorrupt(h *harness) {
	t := h.t
	if h.PutForeign == nil {
		t.Log("Subject.PutForeign is nil: the store keeps no encoding another program could write, so corrupt records do not apply")
		return
	}
	for _, kind := range Foreigns {
		k := h.key("foreign:" + kind)
		require.NoError(t, h.PutForeign(k, kind), kind)
		corrupt := func(op string, err error) {
			t.Helper()
			if assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "%v: %s", kind, op) {
				assert.Contains(t, err.Error(), k[:min(len(k), keyInMessage)], "%v: %s: the error names the key", kind, op)
			}
		}
		req := request(nil)
		res, err := h.Store.Claim(h.ctx, k, req)
		corrupt("claim", err)
		assert.False(t, res.Acquired, "%v: a corrupt record is never acquired over", kind)
		assert.NotEqual(t, idempotency.StateCompleted, res.Record.State, "%v: a corrupt record is never a duplicate", kind)
		_, err = h.Store.Get(h.ctx, k)
		corrupt("get", err)
		corrupt("renew", h.Store.Renew(h.ctx, k, req.Token, lease))
		corrupt("complete", h.Store.Complete(h.ctx, k, req.Token, []byte("r"), time.Minute))
		corrupt("fail", h.Store.Fail(h.ctx, k, req.Token, time.Minute))
		corrupt("release", h.Store.Release(h.ctx, k, req.Token))
		res, err = h.Store.Claim(h.ctx, k, request(nil))
		corrupt("claim after the others", err)
		assert.False(t, res.Acquired, "%v", kind)
		_, err = h.Store.Get(h.ctx, k)
		corrupt("get after the others: nothing overwrote the value", err)

		require.NoError(t, h.Store.Delete(h.ctx, k), "%v: Delete removes anything", kind)
		assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "%v", kind)
		assert.True(t, h.claim(k, nil).Acquired, "%v: a deleted corrupt key starts afresh", kind)
	}
}

func testCancelledContext(h *harness) {
	t, k := h.t, h.key("k")
	tok := h.mustAcquire(k)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.Store.Claim(ctx, h.key("other"), request(nil))
	assert.ErrorIs(t, err, context.Canceled, "claim")
	assert.ErrorIs(t, h.Store.Renew(ctx, k, tok, lease), context.Canceled, "renew")
	assert.ErrorIs(t, h.Store.Complete(ctx, k, tok, nil, time.Minute), context.Canceled, "complete")
	assert.ErrorIs(t, h.Store.Fail(ctx, k, tok, time.Minute), context.Canceled, "fail")
	assert.ErrorIs(t, h.Store.Release(ctx, k, tok), context.Canceled, "release")
	_, err = h.Store.Get(ctx, k)
	assert.ErrorIs(t, err, context.Canceled, "get")
	assert.ErrorIs(t, h.Store.Delete(ctx, k), context.Canceled, "delete")

	assert.Equal(t, idempotency.StateAbsent, h.get(h.key("other")).State, "a cancelled claim changes nothing")
	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "cancelled calls change nothing")
	assert.Equal(t, tok, rec.Token)
}

func testBadArguments(h *harness) {
	t, k := h.t, h.key("k")
	for _, d := range []time.Duration{0, -time.Second} {
		req := request(nil)
		req.Lease = d
		_, err := h.Store.Claim(h.ctx, k, req)
		assert.ErrorIs(t, err, idempotency.ErrInvalidTTL, "claim lease %v", d)
		req = request(nil)
		req.TTL = d
		_, err = h.Store.Claim(h.ctx, k, req)
		assert.ErrorIs(t, err, idempotency.ErrInvalidTTL, "claim ttl %v", d)
	}
	req := request(nil)
	req.Token = ""
	_, err := h.Store.Claim(h.ctx, k, req)
	assert.ErrorIs(t, err, idempotency.ErrEmptyToken, "claim")
	assert.Equal(t, idempotency.StateAbsent, h.get(k).State, "a rejected claim writes nothing")
	tok := h.mustAcquire(k)
	for _, d := range []time.Duration{0, -time.Second} {
		assert.ErrorIs(t, h.Store.Renew(h.ctx, k, tok, d), idempotency.ErrInvalidTTL, "renew %v", d)
		assert.ErrorIs(t, h.Store.Complete(h.ctx, k, tok, nil, d), idempotency.ErrInvalidTTL, "complete %v", d)
		assert.ErrorIs(t, h.Store.Fail(h.ctx, k, tok, d), idempotency.ErrInvalidTTL, "fail %v", d)
	}
	_, err = h.Store.Claim(h.ctx, "", request(nil))
	assert.ErrorIs(t, err, idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, "", tok, lease), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, "", tok, nil, lease), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, "", tok, lease), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Release(h.ctx, "", tok), idempotency.ErrEmptyKey)
	_, err = h.Store.Get(h.ctx, "")
	assert.ErrorIs(t, err, idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Delete(h.ctx, ""), idempotency.ErrEmptyKey)
	assert.ErrorIs(t, h.Store.Renew(h.ctx, k, "", lease), idempotency.ErrEmptyToken)
	assert.ErrorIs(t, h.Store.Complete(h.ctx, k, "", nil, lease), idempotency.ErrEmptyToken)
	assert.ErrorIs(t, h.Store.Fail(h.ctx, k, "", lease), idempotency.ErrEmptyToken)
	assert.ErrorIs(t, h.Store.Release(h.ctx, k, ""), idempotency.ErrEmptyToken)

	rec := h.get(k)
	assert.Equal(t, idempotency.StateInProgress, rec.State, "rejected calls change nothing")
	assert.Equal(t, tok, rec.Token)
}
