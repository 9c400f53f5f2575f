package adapter_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// TestFingerprintStable: the fingerprints of records already in a store
// must still match after an upgrade, so the hash of given fields never
// changes. The expected values are those of the adapters' own hashing
// before it moved here.
func TestFingerprintStable(t *testing.T) {
	body := sha256.Sum256([]byte(`{"amount":1}`))
	assert.Equal(t, "57cf40fae81fcd3b5e3ae2ce3e9aa907d16bb42240a1152defa0def058077f50",
		hex.EncodeToString(adapter.Fingerprint(1, []byte("POST"), []byte("/pay"), []byte("x=1"), body[:])), "HTTP: method, path, query, body hash")
	assert.Equal(t, "595880a68d6e806b090b6613134c170f2a0ca86f2a496d7281ccb5862843f6e2",
		hex.EncodeToString(adapter.Fingerprint(1, []byte("/p.v1.P/Charge"), []byte{8, 100})), "gRPC: method, request bytes")
	// Moving a byte from one field to the next changes the fingerprint.
	assert.NotEqual(t, adapter.Fingerprint(1, []byte("ab"), []byte("c")), adapter.Fingerprint(1, []byte("a"), []byte("bc")))
	assert.NotEqual(t, adapter.Fingerprint(1, []byte("a")), adapter.Fingerprint(2, []byte("a")), "the version")
}

// TestStoreKey: the prefix, a colon, 32 hex digits of SHA-256(scope) (or
// the escaped scope), a colon and the key, for any prefix; a key over
// MaxKeyLength, or one that looks hashed, is hashed.
func TestStoreKey(t *testing.T) {
	assert.Equal(t, "grpcidem:2bd806c97f0e00af1a1fc3328fa763a9:k1", adapter.StoreKey("grpcidem", "alice", "k1", true))
	assert.Equal(t, "p:e3b0c44298fc1c149afbf4c8996fb924::", adapter.StoreKey("p", "", ":", true))
	assert.Equal(t, "idem:a%3Ab%25c:k", adapter.StoreKey("idem", "a:b%c", "k", false))

	long := strings.Repeat("k", adapter.MaxKeyLength)
	assert.Equal(t, "p:s:"+long, adapter.StoreKey("p", "s", long, false), "MaxKeyLength bytes stay")
	sum := sha256.Sum256([]byte(long + "k"))
	assert.Equal(t, "p:s:sha256:"+hex.EncodeToString(sum[:]), adapter.StoreKey("p", "s", long+"k", false), "one more is hashed")
	sum = sha256.Sum256([]byte("sha256:x"))
	assert.Equal(t, "p:s:sha256:"+hex.EncodeToString(sum[:]), adapter.StoreKey("p", "s", "sha256:x", false), "a key that looks hashed is hashed")
}

func TestCheckKey(t *testing.T) {
	require.NoError(t, adapter.CheckKey(" ~"))
	require.NoError(t, adapter.CheckKey(strings.Repeat("k", 10*adapter.MaxKeyLength)), "a long key is hashed, not refused")
	assert.ErrorIs(t, adapter.CheckKey(""), adapter.ErrKeyEmpty)
	assert.ErrorIs(t, adapter.CheckKey("a\x7f"), adapter.ErrKeyNotPrintable)
	assert.ErrorIs(t, adapter.CheckKey(strings.Repeat("\x00", 3)), adapter.ErrKeyNotPrintable)
}
