package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

type harness struct {
	Subject
	t      *testing.T
	ctx    context.Context
	prefix string

	mu   sync.Mutex
	keys []string
}

// key returns a key unique to this subtest, remembered for cleanup.
func (h *harness) key(suffix string) string {
	k := h.prefix + suffix
	h.mu.Lock()
	h.keys = append(h.keys, k)
	h.mu.Unlock()
	return k
}

func (h *harness) cleanup() {
	for _, k := range h.keys {
		_ = h.Store.Delete(context.Background(), k)
	}
}

func (h *harness) advance(d time.Duration) {
	if h.Advance != nil {
		h.Advance(d)
		return
	}
	time.Sleep(d)
}

// request returns the suite's claim request, with a fresh token.
func request(fp []byte) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: ttl, Fingerprint: fp}
}

func (h *harness) claimWith(key string, req idempotency.ClaimRequest) idempotency.ClaimResult {
	h.t.Helper()
	res, err := h.Store.Claim(h.ctx, key, req)
	require.NoError(h.t, err)
	if res.Acquired {
		require.Equal(h.t, req.Token, res.Record.Token, "an acquired record carries the claim's token")
		require.Equal(h.t, idempotency.StateInProgress, res.Record.State)
	}
	return res
}

// claim claims key with a fresh token.
func (h *harness) claim(key string, fp []byte) idempotency.ClaimResult {
	h.t.Helper()
	return h.claimWith(key, request(fp))
}

// mustAcquire claims key with a fresh token, which it returns.
func (h *harness) mustAcquire(key string) string {
	h.t.Helper()
	req := request(nil)
	res := h.claimWith(key, req)
	require.True(h.t, res.Acquired, "claim of %q must acquire, record %+v", key, res.Record)
	return req.Token
}

func (h *harness) get(key string) idempotency.Record {
	h.t.Helper()
	rec, err := h.Store.Get(h.ctx, key)
	require.NoError(h.t, err)
	return rec
}

// storeNow returns the store's time: a fresh key's UpdatedAt, from Get.
func (h *harness) storeNow() time.Time {
	h.t.Helper()
	k := h.key("now:" + randomHex(4))
	require.True(h.t, h.claim(k, nil).Acquired)
	return h.get(k).UpdatedAt
}

// freshTime asserts kept is within Subject.FreshClaimTimes of claimed.
func (h *harness) freshTime(claimed, kept time.Time, what string) {
	h.t.Helper()
	assert.WithinDuration(h.t, claimed, kept, max(h.FreshClaimTimes, time.Millisecond), what)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
