package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// get --http finds the key an HTTP client sent, under SingleTenant and in a
// scope, and shows the stored response: status, headers, body size.
func TestGetHTTPKey(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		serve := func(cfg httpidem.Config) *httptest.Server {
			cfg.KeyPrefix = e.prefix
			once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: e.store})
			require.NoError(t, err)
			m, err := httpidem.New(once, &cfg)
			require.NoError(t, err)
			srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/orders/42")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte("order 42 placed"))
			})))
			t.Cleanup(srv.Close)
			return srv
		}
		post := func(srv *httptest.Server, key, client string) {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("X-Client", client)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_ = resp.Body.Close()
			require.Equal(t, http.StatusCreated, resp.StatusCode)
		}
		post(serve(httpidem.Config{SingleTenant: true}), "order-42", "")
		post(serve(httpidem.Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Client") }}), "order-43", "alice")

		v := e.jsonRun(t, "", exitOK, "get", "--http", "--prefix", e.prefix, "order-42")
		// Under SingleTenant the scope is empty: its hash is SHA-256("").
		assert.Equal(t, e.prefix+":e3b0c44298fc1c149afbf4c8996fb924:order-42", v["key"])
		assert.Equal(t, "completed", v["state"])
		out := v["output"].(map[string]any)
		assert.Equal(t, "http_response", out["format"])
		assert.EqualValues(t, http.StatusCreated, out["status"])
		assert.Equal(t, []any{"/orders/42"}, out["headers"].(map[string]any)["Location"])
		assert.EqualValues(t, len("order 42 placed"), out["body_bytes"])
		assert.Equal(t, true, out["body_stored"])

		// The quoted form of a key (Idempotency-Key: "order-42") is the same key.
		v = e.jsonRun(t, "", exitOK, "get", "--http", "--prefix", e.prefix, `"order-42"`)
		assert.Equal(t, e.prefix+":e3b0c44298fc1c149afbf4c8996fb924:order-42", v["key"])

		v = e.jsonRun(t, "", exitOK, "get", "--http", "--prefix", e.prefix, "--scope", "alice", "order-43")
		assert.Equal(t, "completed", v["state"])
		assert.Equal(t, "http_response", v["output"].(map[string]any)["format"])
		e.jsonRun(t, "", exitNotFound, "get", "--http", "--prefix", e.prefix, "order-43") // not under SingleTenant's scope

		// Without --http the stored key finds the same record, decoded the
		// same way; and the text names the status, a header and the size.
		text := idemctl(t, "", append([]string{"get", e.prefix + ":e3b0c44298fc1c149afbf4c8996fb924:order-42"}, e.flags...)...)
		require.Equal(t, exitOK, text.code, text.stderr)
		assert.Contains(t, text.stdout, "http_response")
		assert.Regexp(t, `status:\s+201`, text.stdout)
		assert.Regexp(t, `header:\s+Location: /orders/42`, text.stdout)
		assert.Regexp(t, `body:\s+15 bytes`, text.stdout)
	})
}

// get --grpc finds the key a gRPC client sent and shows the stored answer:
// the response's type and size, or the final status.
func TestGetGRPCKey(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		const place, cancel = "/orders.v1.Orders/Place", "/orders.v1.Orders/Cancel"
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: e.store})
		require.NoError(t, err)
		m, err := grpcidem.New(once, &grpcidem.Config{KeyPrefix: e.prefix, SingleTenant: true, Methods: []string{place, cancel}})
		require.NoError(t, err)
		call := func(method, key string, handler grpc.UnaryHandler) {
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", key))
			_, _ = m.UnaryServerInterceptor(ctx, wrapperspb.String("order"), &grpc.UnaryServerInfo{FullMethod: method}, handler)
		}
		call(place, "order-42", func(context.Context, any) (any, error) { return wrapperspb.String("placed 42"), nil })
		call(cancel, "order-44", func(context.Context, any) (any, error) {
			return nil, status.Error(codes.FailedPrecondition, "already shipped")
		})

		v := e.jsonRun(t, "", exitOK, "get", "--grpc", "--prefix", e.prefix, "order-42")
		assert.Equal(t, e.prefix+":e3b0c44298fc1c149afbf4c8996fb924:order-42", v["key"])
		assert.Equal(t, "completed", v["state"])
		out := v["output"].(map[string]any)
		assert.Equal(t, "grpc_response", out["format"])
		assert.Equal(t, "google.protobuf.StringValue", out["type"])
		assert.EqualValues(t, 11, out["bytes"], "the wire size of StringValue{\"placed 42\"}")

		v = e.jsonRun(t, "", exitOK, "get", "--grpc", "--prefix", e.prefix, "order-44")
		out = v["output"].(map[string]any)
		assert.Equal(t, "grpc_status", out["format"])
		assert.Equal(t, "FailedPrecondition", out["code"])
		assert.Equal(t, "already shipped", out["message"])

		// Under a KeyPrefix of its own, the stored key alone is decoded too.
		v = e.jsonRun(t, "", exitOK, "get", e.prefix+":e3b0c44298fc1c149afbf4c8996fb924:order-42")
		assert.Equal(t, "grpc_response", v["output"].(map[string]any)["format"])

		text := idemctl(t, "", append([]string{"get", "--grpc", "--prefix", e.prefix, "order-42"}, e.flags...)...)
		require.Equal(t, exitOK, text.code, text.stderr)
		assert.Regexp(t, `type:\s+google.protobuf.StringValue`, text.stdout)
		assert.Regexp(t, `size:\s+11 bytes`, text.stdout)
	})
}

// --http and --grpc name one adapter; --scope and --prefix need one.
func TestGetAdapterKeyUsage(t *testing.T) {
	for _, args := range [][]string{
		{"get", "--http", "--grpc", "k"},
		{"get", "--scope", "alice", "k"},
		{"get", "--http", "a,b"}, // a header holding two keys
		{"get", "--grpc", "k\x01"},
	} {
		r := idemctl(t, "", append(args, "--store", "redis://"+testserver.RedisAddr(t)+"/0")...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
	}
}
