package httpidem_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestForwardKey: the handler sees a forward key that holds the scope's
// hash, never the scope, and the parsed key, the same for a key sent quoted
// and bare; a method the middleware passes has none.
func TestForwardKey(t *testing.T) {
	store := memstore.New(nil)
	idem, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store}, Config: httpidem.Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}})
	require.NoError(t, err)
	type seen struct {
		key, forward     string
		keyOK, forwardOK bool
	}
	var got seen
	h := idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = seen{}
		got.forward, got.forwardOK = httpidem.ForwardKey(r.Context())
		_, got.key, got.keyOK = strings.Cut(got.forward, ":")
		w.WriteHeader(http.StatusInternalServerError) // FAILED: the next form of the key runs again
	}))
	serve := func(method, tenant, key string) seen {
		req := httptest.NewRequest(method, "/orders", nil)
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), req)
		return got
	}
	scope := sha256.Sum256([]byte("tenant-a"))
	want := seen{key: "k,1", forward: hex.EncodeToString(scope[:16]) + ":k,1", keyOK: true, forwardOK: true}

	assert.Equal(t, want, serve(http.MethodPost, "tenant-a", `"k,1"`), "quoted")
	want.key, want.forward = "k1", hex.EncodeToString(scope[:16])+":k1"
	quoted := serve(http.MethodPost, "tenant-a", `"k1"`)
	bare := serve(http.MethodPost, "tenant-a", `k1`)
	assert.Equal(t, want, quoted)
	assert.Equal(t, quoted, bare, "both forms of one key forward as one value")
	other := serve(http.MethodPost, "tenant-b", `k1`)
	assert.Equal(t, "k1", other.key)
	assert.NotEqual(t, bare.forward, other.forward, "two tenants forward two values")
	assert.NotContains(t, other.forward, "tenant-b", "the scope is hashed")
	assert.Equal(t, seen{}, serve(http.MethodGet, "tenant-a", "k1"), "GET is not a method of the middleware")
}
