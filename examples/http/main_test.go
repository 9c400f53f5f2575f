package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/examples/internal/readmetest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// session is one "$ curl ..." of the README with the output it shows.
type session struct {
	command []string // the curl arguments, shell-split
	status  string   // "HTTP/1.1 201 Created"
	header  map[string]string
	body    string
}

// TestREADMESession runs the README's curl session, in order, against the
// program's handler on a fresh in-memory store, and checks that every answer
// is exactly what the README shows (the Date header aside).
func TestREADMESession(t *testing.T) {
	sessions := readSessions(t, "README.md")
	require.Len(t, sessions, 5, "the README shows five curl commands")

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil)})
	require.NoError(t, err)
	api, err := newAPI(once, gochannel.NewGoChannel(gochannel.Config{}, nil))
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)

	for i, s := range sessions {
		resp := runCurl(t, srv, s.command)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		_ = resp.Body.Close()

		assert.Equal(t, s.status, resp.Proto+" "+resp.Status, "command %d", i+1)
		got := map[string]string{}
		for name := range resp.Header {
			if name != "Date" {
				got[name] = strings.Join(resp.Header.Values(name), ", ")
			}
		}
		assert.Equal(t, s.header, got, "command %d: headers", i+1)
		assert.Equal(t, s.body, string(body), "command %d: body", i+1)
	}
}

// TestRedisStore runs the retry against the Redis store that REDIS_URL
// would select.
func TestRedisStore(t *testing.T) {
	store, closeStore, err := openStore("redis://" + testserver.RedisAddr(t) + "/0")
	require.NoError(t, err)
	t.Cleanup(closeStore)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	api, err := newAPI(once, gochannel.NewGoChannel(gochannel.Config{}, nil))
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)

	key := "example-http-test-" + randomSuffix(t)
	// The documented stored key: the default prefix, a colon, the hex of
	// the first 16 bytes of SHA-256(scope), a colon and the key. The scope,
	// an API key, is not in it.
	scope := sha256.Sum256([]byte("sk_test_redis"))
	storedKey := "httpidem" + ":" + hex.EncodeToString(scope[:16]) + ":" + key
	c := testserver.RedisClient(t)
	t.Cleanup(func() { _ = c.Del(context.Background(), storedKey).Err() })
	cmd := []string{"-X", "POST", "http://x/payments", "-H", "Authorization: Bearer sk_test_redis",
		"-H", "Idempotency-Key: " + key, "-d", `{"amount":1000,"currency":"eur"}`}
	first := runCurl(t, srv, cmd)
	firstBody, _ := io.ReadAll(first.Body)
	again := runCurl(t, srv, cmd)
	againBody, _ := io.ReadAll(again.Body)
	assert.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Equal(t, http.StatusCreated, again.StatusCode)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, string(firstBody), string(againBody))
	n, err := c.Exists(context.Background(), storedKey).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the record is under the documented key")
}

func randomSuffix(t *testing.T) string {
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// readSessions reads the README's curl commands, the output "curl -si"
// prints under each.
func readSessions(t *testing.T, path string) []session {
	t.Helper()
	var sessions []session
	for _, s := range readmetest.Sessions(t, path, "curl") {
		sessions = append(sessions, parseOutput(t, s.Args, s.Output))
	}
	return sessions
}

// parseOutput splits "curl -si" output into status line, headers and body.
func parseOutput(t *testing.T, command, lines []string) session {
	t.Helper()
	require.NotEmpty(t, lines, "a command without output")
	s := session{command: command, status: lines[0], header: map[string]string{}}
	i := 1
	for ; i < len(lines) && lines[i] != ""; i++ {
		name, value, ok := strings.Cut(lines[i], ": ")
		require.True(t, ok, "not a header line: %q", lines[i])
		if name != "Date" {
			s.header[name] = value
		}
	}
	if i < len(lines) {
		s.body = strings.Join(lines[i+1:], "\n") + "\n"
	}
	return s
}

// runCurl performs what the curl arguments ask (-X, -H, -d and a URL;
// -s and -i only shape curl's output) against srv.
func runCurl(t *testing.T, srv *httptest.Server, args []string) *http.Response {
	t.Helper()
	method, target, data := http.MethodGet, "", ""
	hasData := false
	header := http.Header{}
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "-s", "-i", "-si":
		case "-X", "-H", "-d":
			require.Less(t, i+1, len(args), "%s needs a value", a)
			i++
			switch a {
			case "-X":
				method = args[i]
			case "-H":
				name, value, ok := strings.Cut(args[i], ": ")
				require.True(t, ok, "bad header %q", args[i])
				header.Add(name, value)
			case "-d":
				data, hasData = args[i], true
			}
		default:
			require.False(t, strings.HasPrefix(a, "-"), "unsupported curl option %q", a)
			target = a
		}
	}
	u, err := url.Parse(target)
	require.NoError(t, err)
	base, err := url.Parse(srv.URL)
	require.NoError(t, err)
	u.Scheme, u.Host = base.Scheme, base.Host
	var body io.Reader
	if hasData {
		body = strings.NewReader(data)
		if header.Get("Content-Type") == "" {
			header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d does
		}
	}
	req, err := http.NewRequest(method, u.String(), body)
	require.NoError(t, err)
	req.Header = header
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	return resp
}
