package grpcidem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
)

// forwarder is a service whose handlers keep what ForwardKey gives them
// and answer UNAVAILABLE, which leaves the key FAILED: the next call with
// it runs again.
type forwarder struct {
	testpb.UnimplementedLedgerServer
	mu   sync.Mutex
	seen string
	ok   bool
}

func (f *forwarder) keep(ctx context.Context) (*testpb.ChargeReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen, f.ok = grpcidem.ForwardKey(ctx)
	return nil, status.Error(codes.Unavailable, "bank down")
}

func (f *forwarder) Charge(ctx context.Context, _ *testpb.ChargeRequest) (*testpb.ChargeReply, error) {
	return f.keep(ctx)
}

func (f *forwarder) Peek(ctx context.Context, _ *testpb.ChargeRequest) (*testpb.ChargeReply, error) {
	return f.keep(ctx)
}

func (f *forwarder) last() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.seen, f.ok
	f.seen, f.ok = "", false
	return k, ok
}

// TestForwardKey: the handler's context holds the forward key, the scope's
// hash, a colon and the key, as httpidem's: two tenants with one key
// forward two values, and the scope itself is not in them. So it does with
// FailOpen while the store is down; a method outside Methods and a call
// that KeyOptional let through without a key have none.
func TestForwardKey(t *testing.T) {
	hash := func(scope string) string {
		sum := sha256.Sum256([]byte(scope))
		return hex.EncodeToString(sum[:16])
	}
	store, prefix := storeKinds[0].New(t)
	f := &forwarder{}
	c := dial(t, serve(t, f, newInterceptor(t, store, prefix, func(cfg *config) { cfg.KeyOptional = true }).UnaryServerInterceptor))
	req := &testpb.ChargeRequest{Amount: 1}

	charge(t, c, "tenant-a", "k1", req)
	a, ok := f.last()
	assert.True(t, ok)
	assert.Equal(t, hash("tenant-a")+":k1", a)
	charge(t, c, "tenant-b", "k1", req)
	b, ok := f.last()
	assert.True(t, ok)
	assert.Equal(t, hash("tenant-b")+":k1", b)
	assert.NotEqual(t, a, b, "two tenants forward two values")
	assert.NotContains(t, b, "tenant-b", "the scope is hashed")
	charge(t, c, "tenant-a", "", &testpb.ChargeRequest{Amount: 1, RequestId: "k2"})
	k2, _ := f.last()
	assert.Equal(t, hash("tenant-a")+":k2", k2, "a key from the request field forwards the same")

	charge(t, c, "tenant-a", "", req)
	_, ok = f.last()
	assert.False(t, ok, "KeyOptional, no key")
	invoke(t, c.Peek, "tenant-a", "k1", req)
	_, ok = f.last()
	assert.False(t, ok, "Peek is not a method of the interceptor")

	down := dial(t, serve(t, f, newInterceptor(t, adaptertest.DownStores[1].New(t), "", func(cfg *config) { cfg.FailOpen = true }).UnaryServerInterceptor))
	charge(t, down, "tenant-a", "k1", req)
	open, ok := f.last()
	require.True(t, ok, "FailOpen runs the handler with the forward key")
	assert.Equal(t, a, open)
}

// TestForwardKeyMatchesHTTP: a gRPC call and an HTTP request of one scope
// with one key forward the same value, so that one consumer deduplicates
// the work both hand on; of two scopes, two values. So with SingleTenant.
func TestForwardKeyMatchesHTTP(t *testing.T) {
	store, prefix := storeKinds[0].New(t)
	httpForward := func(single bool, tenant, key string) string {
		var got string
		cfg := httpidem.Config{KeyPrefix: prefix + "h", SingleTenant: single}
		if !single {
			cfg.Scope = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
		}
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
		require.NoError(t, err)
		m, err := httpidem.New(once, &cfg)
		require.NoError(t, err)
		srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, _ = httpidem.ForwardKey(r.Context())
			w.WriteHeader(http.StatusServiceUnavailable) // FAILED: the next request runs again
		})))
		defer srv.Close()
		req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Tenant", tenant)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return got
	}
	f := &forwarder{}
	scoped := dial(t, serve(t, f, newInterceptor(t, store, prefix, nil).UnaryServerInterceptor))
	single := dial(t, serve(t, f, newInterceptor(t, store, prefix+"s", func(cfg *config) {
		cfg.Scope, cfg.SingleTenant = nil, true
	}).UnaryServerInterceptor))
	grpcForward := func(c testpb.LedgerClient, tenant, key string) string {
		charge(t, c, tenant, key, &testpb.ChargeRequest{Amount: 1})
		k, ok := f.last()
		require.True(t, ok)
		return k
	}

	const key = "order-42:x"
	a := grpcForward(scoped, "tenant-a", key)
	assert.Equal(t, a, httpForward(false, "tenant-a", key), "one scope, one key")
	assert.NotEqual(t, a, httpForward(false, "tenant-b", key), "two scopes")
	assert.Equal(t, grpcForward(single, "tenant-a", key), httpForward(true, "tenant-b", key), "SingleTenant")
}
