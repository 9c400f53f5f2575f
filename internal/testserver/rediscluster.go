package testserver

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedisCluster starts a Redis Cluster of three masters (no replicas) on
// free loopback ports, waits until it serves all slots, and tears it down when
// the test ends. It returns the seed addresses. extraArgs are passed to
// every node's redis-server.
func StartRedisCluster(t testing.TB, extraArgs ...string) []string {
	t.Helper()
	var addrs []string
	for range 3 {
		args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}, extraArgs...)
		s := StartRedis(t, args...)
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
