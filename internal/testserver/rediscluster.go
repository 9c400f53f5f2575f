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

// StartReplicatedRedisCluster is StartRedisCluster with one replica per
// master, each in sync when it returns. It returns the masters' addresses
// and each master's replica by that address.
func StartReplicatedRedisCluster(t testing.TB, extraArgs ...string) (addrs []string, replicas map[string]*RedisServer) {
	t.Helper()
	addrs = StartRedisCluster(t, extraArgs...)
	replicas = map[string]*RedisServer{}
	ctx := context.Background()
	for _, addr := range addrs {
		master := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
		id, err := master.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("cluster myid of %s: %v", addr, err)
		}
		r := StartRedis(t, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}, extraArgs...)...)
		replica := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: r.Addr})
		host, port, _ := strings.Cut(addr, ":")
		if err := replica.Do(ctx, "cluster", "meet", host, port).Err(); err != nil {
			t.Fatalf("cluster meet from %s: %v", r.Addr, err)
		}
		// CLUSTER REPLICATE needs the master known, which the handshake
		// takes a moment to make it.
		deadline := time.Now().Add(20 * time.Second)
		for err = replica.Do(ctx, "cluster", "replicate", id).Err(); err != nil; err = replica.Do(ctx, "cluster", "replicate", id).Err() {
			if time.Now().After(deadline) {
				t.Fatalf("cluster replicate %s from %s: %v", id, r.Addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for {
			n, err := master.Wait(ctx, 1, 50*time.Millisecond).Result()
			if err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the replica %s of %s never caught up: %v", r.Addr, addr, err)
			}
		}
		_ = replica.Close()
		_ = master.Close()
		replicas[addr] = r
	}
	return addrs, replicas
}
