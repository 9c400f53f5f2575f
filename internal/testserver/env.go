package testserver

import (
	"net"
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
	var err error
	for range 10 {
		var c net.Conn
		c, err = net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("%s is required at %s (set %s to change it): %v", what, addr, envVar, err)
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
