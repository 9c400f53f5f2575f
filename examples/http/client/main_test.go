package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/examples/internal/readmetest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// TestREADMEOutput builds the payments API of examples/http, starts it on
// the in-memory store and on Redis, runs the client against it, and checks
// that it prints what examples/http/README.md shows, the key and the
// payment id aside.
func TestREADMEOutput(t *testing.T) {
	want := normalize(readmetest.Output(t, "../README.md", "go run ./examples/http/client"))
	bin := filepath.Join(t.TempDir(), "http-api")
	out, err := exec.Command("go", "build", "-o", bin, "..").CombinedOutput()
	require.NoError(t, err, "%s", out)

	for _, store := range []string{"memstore", "redis"} {
		t.Run(store, func(t *testing.T) {
			apiKey := "sk_test_client_" + strconv.FormatInt(time.Now().UnixNano(), 36)
			env := []string{}
			if store == "redis" {
				redisAddr := testserver.RedisAddr(t)
				env = append(env, "REDIS_URL=redis://"+redisAddr+"/0")
				deleteKeysOf(t, apiKey)
			}
			api := startAPI(t, bin, env)

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var printed bytes.Buffer
			require.NoError(t, run(ctx, api, apiKey, &printed))
			got := strings.Split(strings.TrimSuffix(printed.String(), "\n"), "\n")
			t.Logf("printed:\n%s", printed.String())
			assert.Equal(t, want, normalize(got))

			ids := regexp.MustCompile(`pay_[0-9a-f]{12}`).FindAllString(printed.String(), -1)
			require.NotEmpty(t, ids)
			for _, id := range ids {
				assert.Equal(t, ids[0], id, "one payment")
			}
		})
	}
}

var (
	uuidRE    = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	paymentRE = regexp.MustCompile(`pay_[0-9a-f]{12}`)
	attemptRE = regexp.MustCompile(`, attempt (\d+): `)
)

// normalize replaces the key and the payment id, which differ on each run,
// and drops the 409 a retry gets when it comes before the API has
// recorded the first answer (it records it before it sends it unless the
// store takes over 100 ms), renumbering the attempts after it.
func normalize(lines []string) []string {
	var out []string
	n := 0
	for _, l := range lines {
		if strings.Contains(l, ": 409 Conflict") {
			continue
		}
		if m := attemptRE.FindStringSubmatch(l); m != nil {
			if m[1] == "1" {
				n = 1
			} else {
				n++
			}
			l = attemptRE.ReplaceAllString(l, ", attempt "+strconv.Itoa(n)+": ")
		}
		l = uuidRE.ReplaceAllString(l, "KEY")
		out = append(out, paymentRE.ReplaceAllString(l, "pay_ID"))
	}
	return out
}

// startAPI starts the API binary on a free port and returns its URL; it is
// stopped when the test ends.
func startAPI(t *testing.T, bin string, env []string) string {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t))
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), "ADDR="+addr, "REDIS_URL="), env...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return "http://" + addr
		}
		if i == 100 {
			t.Fatalf("the API did not start: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer that a process writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// deleteKeysOf deletes, when the test ends, the records the API keeps in
// Redis for the caller apiKey: their names hold the hash of the scope.
func deleteKeysOf(t *testing.T, apiKey string) {
	scope := sha256.Sum256([]byte(apiKey))
	pattern := "httpidem" + ":" + hex.EncodeToString(scope[:16]) + ":*"
	c := testserver.RedisClient(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, pattern, 100).Iterator()
		for iter.Next(ctx) {
			_ = c.Del(ctx, iter.Val()).Err()
		}
	})
}
