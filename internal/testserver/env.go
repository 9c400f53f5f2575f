package testserver

import (
	"context"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Env returns the environment variable name's value, or def when it is unset
// or empty.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// requireService skips under -short and otherwise fails the test unless a TCP
// connection to addr succeeds within a few seconds.
func requireService(t testing.TB, what, envVar, addr string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s-backed test left out by -short", what)
	}
	err := awaitPing(func(ctx context.Context) error {
		c, err := new(net.Dialer).DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("%s is required at %s (set %s to change it): %v", what, addr, envVar, err)
	}
}

// awaitPing calls ping, with a timeout of a second, up to ten times 300 ms
// apart until it succeeds, and returns its last error.
func awaitPing(ping func(context.Context) error) error {
	var err error
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = ping(ctx)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	return err
}

// serviceURL returns the URL of a shared server from envVar, or def when
// it is unset, and, as requireService does, skips under -short and
// otherwise fails the test unless the server answers (at defPort when the
// URL names no port).
func serviceURL(t testing.TB, what, envVar, def, defPort string) string {
	t.Helper()
	raw := Env(envVar, def)
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		t.Fatalf("%s=%q is not a server URL: %v", envVar, raw, err)
	}
	port := u.Port()
	if port == "" {
		port = defPort
	}
	requireService(t, what, envVar, net.JoinHostPort(u.Hostname(), port))
	return raw
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitPort waits until a TCP connection to addr succeeds.
func waitPort(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
