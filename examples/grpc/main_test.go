package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idempotency/watermill-idempotency/examples/grpc/paymentspb"
	"github.com/idempotency/watermill-idempotency/examples/internal/readmetest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// grpcurlPackage is the grpcurl the README installs, and the test runs.
const grpcurlPackage = "github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4"

// readmeAddr is the server address the README's commands use; the test
// puts its own server's address in its place.
const readmeAddr = "127.0.0.1:50051"

// TestREADMESession runs the README's grpcurl commands, in order, with the
// grpcurl the README installs, against the program's server on a fresh
// in-memory store, and checks that every output is exactly what the README
// shows.
func TestREADMESession(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "go install "+grpcurlPackage, "the README installs the grpcurl the test runs")
	sessions := readmetest.Sessions(t, "README.md", "grpcurl")
	require.Len(t, sessions, 5, "the README shows five grpcurl commands")

	grpcurl := installGrpcurl(t)
	addr := startServer(t, memstoreFor(t))
	for i, s := range sessions {
		args := make([]string, len(s.Args))
		for j, a := range s.Args {
			args[j] = strings.ReplaceAll(a, readmeAddr, addr)
		}
		cmd := exec.Command(grpcurl, args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "command %d did not run", i+1)
			assert.True(t, strings.HasPrefix(string(out), "ERROR:"), "command %d failed without an error shown: %s", i+1, out)
		}
		want := strings.Join(s.Output, "\n") + "\n"
		assert.Equal(t, want, string(out), "command %d: grpcurl %s", i+1, strings.Join(s.Args, " "))
	}
}

// TestGoClient: the README's Go client, with the client interceptor: two
// logical calls are two payments, and a call the application repeats with
// the same key is replayed.
func TestGoClient(t *testing.T) {
	t.Parallel()
	addr := startServer(t, memstoreFor(t))
	client := &grpcidem.Client{}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
		"name": [{"service": "payments.v1.Payments"}],
		"retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
			"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}}]}`))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := paymentspb.NewPaymentsClient(conn)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sk_test_go")

	req := &paymentspb.CreatePaymentRequest{Amount: 1000, Currency: "EUR"}
	p1, err := c.CreatePayment(ctx, req)
	require.NoError(t, err)
	p2, err := c.CreatePayment(ctx, req)
	require.NoError(t, err)
	assert.NotEqual(t, p1.Id, p2.Id, "each logical call has its own key")

	p3 := requireReplayed(t, c, grpcidem.WithKey(ctx, "order-7"), req)

	got, err := c.GetPayment(ctx, &paymentspb.GetPaymentRequest{Id: p3.Id})
	require.NoError(t, err)
	assert.Equal(t, p3.Id, got.Id)
}

// TestRedisStore runs a retry against the Redis store that REDIS_URL would
// select, and finds the record under the documented key.
func TestRedisStore(t *testing.T) {
	t.Parallel()
	store, closeStore, err := openStore("redis://" + testserver.RedisAddr(t) + "/0")
	require.NoError(t, err)
	t.Cleanup(closeStore)
	addr := startServer(t, store)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := paymentspb.NewPaymentsClient(conn)

	key := "example-grpc-test-" + randomSuffix(t)
	// The documented stored key: the default prefix, a colon, the hex of
	// the first 16 bytes of SHA-256(scope), a colon and the key. The scope,
	// an API key, is not in it.
	scope := sha256.Sum256([]byte("sk_test_redis"))
	storedKey := "grpcidem" + ":" + hex.EncodeToString(scope[:16]) + ":" + key
	rc := testserver.RedisClient(t)
	t.Cleanup(func() { _ = rc.Del(context.Background(), storedKey).Err() })

	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sk_test_redis")
	requireReplayed(t, c, ctx, &paymentspb.CreatePaymentRequest{RequestId: key, Amount: 1000, Currency: "eur"})
	n, err := rc.Exists(context.Background(), storedKey).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the record is under the documented key")
}

// requireReplayed makes the payment req twice, with the key that ctx or
// req carries: the first call runs, the second gets its replay. It returns
// the payment.
func requireReplayed(t *testing.T, c paymentspb.PaymentsClient, ctx context.Context, req *paymentspb.CreatePaymentRequest) *paymentspb.Payment {
	t.Helper()
	var h1, h2 metadata.MD
	first, err := c.CreatePayment(ctx, req, grpc.Header(&h1))
	require.NoError(t, err)
	again, err := c.CreatePayment(ctx, req, grpc.Header(&h2))
	require.NoError(t, err)
	assert.Equal(t, first.Id, again.Id)
	assert.Empty(t, h1.Get(grpcidem.ReplayedMetadata))
	assert.Equal(t, []string{"true"}, h2.Get(grpcidem.ReplayedMetadata))
	return first
}

func memstoreFor(t *testing.T) idempotency.Store {
	s := memstore.New(nil)
	return s
}

// startServer serves the program's server on a free loopback port until
// the test ends, and returns its address.
func startServer(t *testing.T, store idempotency.Store) string {
	t.Helper()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	srv, err := newServer(once)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// installGrpcurl returns the grpcurl to run: $GRPCURL when set, else the
// README's version, installed from the Go module proxy into the user's
// cache directory (go install rebuilds nothing, and rewrites nothing, once
// it is there and up to date).
func installGrpcurl(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GRPCURL"); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "watermill-idempotency", strings.ReplaceAll(grpcurlPackage, "/", "_"))
	cmd := exec.Command("go", "install", grpcurlPackage)
	cmd.Env = append(os.Environ(), "GOBIN="+bin)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go install %s (set GRPCURL to use an installed grpcurl):\n%s", grpcurlPackage, out)
	return filepath.Join(bin, "grpcurl")
}

func randomSuffix(t *testing.T) string {
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}
