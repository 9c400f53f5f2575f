package testserver

import (
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// RedisServer is a private redis-server process owned by one test.
type RedisServer struct {
	t    testing.TB
	Addr string
	port int
	dir  string
	args []string
	proc *process
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
	if s.proc != nil {
		return
	}
	bin, err := lookPath("redis-server")
	if err != nil {
		s.t.Fatal(err)
	}
	log := filepath.Join(s.dir, "redis.log")
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", log}, s.args...)
	p, err := processSpec{what: s.String(), bin: bin, args: args, log: log}.start()
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = p
	if err := p.listening(s.Addr, redisStartTimeout); err != nil {
		s.t.Fatal(err)
	}
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to exit.
// Stopping a stopped server does nothing.
func (s *RedisServer) Stop() {
	if s.proc == nil {
		return
	}
	s.proc.kill()
	s.proc = nil
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

// redisStartTimeout bounds the wait for a redis-server (or a sentinel) to
// accept connections.
const redisStartTimeout = 10 * time.Second

// String names the server for failure messages.
func (s *RedisServer) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }
