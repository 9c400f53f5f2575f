package storetest

import (
	"bytes"
	"crypto/rand"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

func testResultRoundTrip(h *harness) {
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	for name, result := range map[string][]byte{
		"empty": {},
		"nil":   nil,
		"1MiB":  big,
		"odd":   []byte("\x00\r\n\"'{}[[]]--\xff\xfe"),
	} {
		k := h.key("result:" + name)
		// A long lease: writing 1 MiB on a loaded machine takes time.
		req := request(nil)
		req.Lease = time.Minute
		require.True(h.t, h.claimWith(k, req).Acquired)
		require.NoError(h.t, h.Store.Complete(h.ctx, k, req.Token, result, time.Minute))
		for _, rec := range []idempotency.Record{h.get(k), h.claim(k, nil).Record} {
			require.NotNil(h.t, rec.Result, "%s: a completed record's result is non-nil", name)
			require.True(h.t, bytes.Equal(result, rec.Result), "%s: result of %d bytes came back as %d bytes", name, len(result), len(rec.Result))
		}
	}
}

func testOddKeys(h *harness) {
	huge := strings.Repeat("k", 1<<20)
	for name, suffix := range map[string]string{
		"1MiB":     huge,
		"nul":      "a\x00b",
		"newline":  "a\nb\r\n",
		"quotes":   `'"` + "`",
		"braces":   "{tag}x{}",
		"lua":      "]]--[[ %s %d \\ .. nil end",
		"not-utf8": "\xff\xfe\xc3\x28",
		"spaces":   " \t ",
	} {
		k := h.key(suffix)
		// A long lease, as in testResultRoundTrip.
		req := request(nil)
		req.Lease = time.Minute
		require.True(h.t, h.claimWith(k, req).Acquired, name)
		tok := req.Token
		require.NoError(h.t, h.Store.Renew(h.ctx, k, tok, time.Minute), name)
		require.NoError(h.t, h.Store.Complete(h.ctx, k, tok, []byte(name), time.Minute), name)
		rec := h.get(k)
		assert.Equal(h.t, idempotency.StateCompleted, rec.State, name)
		assert.Equal(h.t, []byte(name), rec.Result, name)
		if name != "nul" && name != "1MiB" {
			// A truncating store would make these two collide.
			assert.Equal(h.t, idempotency.StateAbsent, h.get(h.prefix+suffix[:len(suffix)-1]).State, name)
		}
	}
	a, b := h.key("x\x00y"), h.key("x\x00z")
	h.mustAcquire(a)
	h.mustAcquire(b) // keys differing after a NUL are different keys
}

func testFingerprint(h *harness) {
	t, k := h.t, h.key("k")
	fpA, fpB := []byte("sha256:A\x00\xff"), []byte("sha256:B")
	owner := request(fpA)
	res := h.claimWith(k, owner)
	require.True(t, res.Acquired)
	assert.Equal(t, fpA, res.Record.Fingerprint)

	other := h.claim(k, fpB)
	assert.False(t, other.Acquired)
	assert.Equal(t, fpA, other.Record.Fingerprint, "the stored fingerprint comes back to tell a reused key")

	require.NoError(t, h.Store.Fail(h.ctx, k, owner.Token, time.Minute))
	other = h.claim(k, fpB)
	assert.False(t, other.Acquired, "a different fingerprint never acquires, even a FAILED key")
	assert.Equal(t, idempotency.StateFailed, other.Record.State)
	assert.Equal(t, fpA, other.Record.Fingerprint)

	again := request(nil)
	res = h.claimWith(k, again)
	require.True(t, res.Acquired, "no fingerprint given: no comparison")
	assert.Equal(t, fpA, res.Record.Fingerprint, "the first fingerprint is kept")
	assert.Equal(t, 2, res.Record.Attempts)
	require.NoError(t, h.Store.Complete(h.ctx, k, again.Token, []byte("r"), time.Minute))

	same := h.claim(k, fpA)
	assert.False(t, same.Acquired)
	assert.Equal(t, idempotency.StateCompleted, same.Record.State)
	assert.Equal(t, fpA, same.Record.Fingerprint)
	assert.Equal(t, fpA, h.get(k).Fingerprint)
}
