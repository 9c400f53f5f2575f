package main

import (
	"bufio"
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

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idempotency/watermill-idempotency/examples/grpc/paymentspb"
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

// session is one "$ grpcurl ..." of the README with the output it shows.
type session struct {
	args   []string // the grpcurl arguments, shell-split
	output string
}

// TestREADMESession runs the README's grpcurl commands, in order, with the
// grpcurl the README installs, against the program's server on a fresh
// in-memory store, and checks that every output is exactly what the README
// shows.
func TestREADMESession(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "go install "+grpcurlPackage, "the README installs the grpcurl the test runs")
	sessions := readSessions(t, "README.md")
	require.Len(t, sessions, 5, "the README shows five grpcurl commands")

	grpcurl := installGrpcurl(t)
	addr := startServer(t, memstoreFor(t))
	for i, s := range sessions {
		args := make([]string, len(s.args))
		for j, a := range s.args {
			args[j] = strings.ReplaceAll(a, readmeAddr, addr)
		}
		cmd := exec.Command(grpcurl, args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "command %d did not run", i+1)
			assert.True(t, strings.HasPrefix(string(out), "ERROR:"), "command %d failed without an error shown: %s", i+1, out)
		}
		assert.Equal(t, s.output, string(out), "command %d: grpcurl %s", i+1, strings.Join(s.args, " "))
	}
}

// TestGoClient: the README's Go client, with the client interceptor: two
// logical calls are two payments, and a call the application repeats with
// the same key is replayed.
func TestGoClient(t *testing.T) {
	t.Parallel()
	addr := startServer(t, memstoreFor(t))
	idem, err := grpcidem.NewClient(grpcidem.ClientConfig{})
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(idem.Unary),
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

	keyed := grpcidem.WithKey(ctx, "order-7")
	var h1, h2 metadata.MD
	p3, err := c.CreatePayment(keyed, req, grpc.Header(&h1))
	require.NoError(t, err)
	p4, err := c.CreatePayment(keyed, req, grpc.Header(&h2))
	require.NoError(t, err)
	assert.Equal(t, p3.Id, p4.Id)
	assert.Empty(t, h1.Get(grpcidem.ReplayedMetadata))
	assert.Equal(t, []string{"true"}, h2.Get(grpcidem.ReplayedMetadata))

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
	storedKey := grpcidem.DefaultKeyPrefix + ":" + hex.EncodeToString(scope[:16]) + ":" + key
	rc := testserver.RedisClient(t)
	t.Cleanup(func() { _ = rc.Del(context.Background(), storedKey).Err() })

	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sk_test_redis")
	req := &paymentspb.CreatePaymentRequest{RequestId: key, Amount: 1000, Currency: "eur"}
	var h1, h2 metadata.MD
	first, err := c.CreatePayment(ctx, req, grpc.Header(&h1))
	require.NoError(t, err)
	again, err := c.CreatePayment(ctx, req, grpc.Header(&h2))
	require.NoError(t, err)
	assert.Equal(t, first.Id, again.Id)
	assert.Empty(t, h1.Get(grpcidem.ReplayedMetadata))
	assert.Equal(t, []string{"true"}, h2.Get(grpcidem.ReplayedMetadata))
	n, err := rc.Exists(context.Background(), storedKey).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the record is under the documented key")

	_, _, err = openStore("http://not-redis")
	assert.Error(t, err, "REDIS_URL must be a redis:// URL")
}

func memstoreFor(t *testing.T) idempotency.Store {
	s := memstore.New(memstore.Config{})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startServer serves the program's server on a free loopback port until
// the test ends, and returns its address.
func startServer(t *testing.T, store idempotency.Store) string {
	t.Helper()
	srv, err := newServer(store, watermill.NopLogger{})
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

// readSessions parses the "```console" blocks of a README: a line
// "$ grpcurl" (continued by lines ending in a backslash) starts a command,
// and the lines up to the next command or the end of the block are its
// output, exactly.
func readSessions(t *testing.T, path string) []session {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()

	var sessions []session
	var cur *session
	var cmdLine strings.Builder
	var output []string
	inBlock, continued := false, false
	flush := func() {
		if cur == nil {
			return
		}
		cur.args = shellSplit(t, cmdLine.String())
		cur.output = strings.Join(output, "\n") + "\n"
		sessions = append(sessions, *cur)
		cur, output = nil, nil
		cmdLine.Reset()
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !inBlock:
			inBlock = line == "```console"
		case line == "```":
			flush()
			inBlock = false
		case continued:
			cmdLine.WriteString(" " + strings.TrimSuffix(strings.TrimSpace(line), `\`))
			continued = strings.HasSuffix(line, `\`)
		case strings.HasPrefix(line, "$ "):
			flush()
			cur = &session{}
			rest, ok := strings.CutPrefix(line, "$ grpcurl ")
			require.True(t, ok, "only grpcurl commands are expected: %q", line)
			cmdLine.WriteString(strings.TrimSuffix(rest, `\`))
			continued = strings.HasSuffix(line, `\`)
		default:
			require.NotNil(t, cur, "output before any command: %q", line)
			output = append(output, line)
		}
	}
	require.NoError(t, sc.Err())
	return sessions
}

// shellSplit splits a command line into words, honouring single quotes.
func shellSplit(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			w.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	require.False(t, quoted, "unterminated quote in %q", line)
	if inWord {
		words = append(words, w.String())
	}
	return words
}
