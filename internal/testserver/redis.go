package testserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisAddr returns the shared Redis server's address (REDIS_ADDR, default
// 127.0.0.1:6379), failing the test when it does not answer.
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr := Env("REDIS_ADDR", "127.0.0.1:6379")
	requireService(t, "Redis", "REDIS_ADDR", addr)
	return addr
}

// RedisClient returns a client of the shared Redis server, closed when the
// test ends. Tests must isolate their keys by prefix: the server is shared,
// and nothing here flushes it.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: RedisAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", c.Options().Addr, err)
	}
	return c
}

// RedisServer is a private redis-server process owned by one test.
type RedisServer struct {
	t    testing.TB
	Addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
	// restartMu makes restarts asked for together run one after the other.
	restartMu sync.Mutex
}

// StartRedis starts a private redis-server on a free loopback port, with no
// persistence, and stops it when the test ends.
func StartRedis(t testing.TB, extraArgs ...string) *RedisServer {
	t.Helper()
	if testing.Short() {
		t.Skip("test with a private redis-server left out by -short")
	}
	port := FreePort(t)
	s := &RedisServer{t: t, port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir(), args: extraArgs}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the server on its port and waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		s.t.Fatalf("redis-server is required on PATH: %v", err)
	}
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	waitRedis(s.t, s.Addr, s.dir)
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to exit.
// Stopping a stopped server does nothing.
func (s *RedisServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server (SIGKILL) and starts it again on its port with
// the same arguments; started with persistence (appendonly yes, appendfsync
// always), it comes back with every write it acknowledged.
func (s *RedisServer) Restart() { s.RestartAfter(0) }

// RestartAfter is Restart with the server down for d.
func (s *RedisServer) RestartAfter(d time.Duration) {
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	s.Stop()
	time.Sleep(d)
	s.Start()
}

// waitRedis waits until the redis-server at addr, logging in dir, accepts
// connections, and fails the test with its log when it does not.
func waitRedis(t testing.TB, addr, dir string) {
	t.Helper()
	if waitPort(addr, 10*time.Second) != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		t.Fatalf("redis-server on %s did not start:\n%s", addr, log)
	}
}

// String names the server for failure messages.
func (s *RedisServer) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }
