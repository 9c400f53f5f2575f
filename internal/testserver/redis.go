package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

func waitRedis(t testing.TB, addr, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
	t.Fatalf("redis-server on %s did not start:\n%s", addr, log)
}

// StartRedisCluster starts a Redis Cluster of three masters (no replicas) on
// free loopback ports, waits until it serves all slots, and tears it down when
// the test ends. It returns the seed addresses.
func StartRedisCluster(t testing.TB) []string {
	t.Helper()
	var addrs []string
	for range 3 {
		s := StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("cluster node %s not ready: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return addrs
}

// String names the server for failure messages.
func (s *RedisServer) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }
