package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions shapes a SentinelSet.
type SentinelOptions struct {
	// ReplicationLatency delays the replication link from the master to
	// the replica by this much each way (a FaultProxy between them), so
	// that the replica lags as it does under load or across a network.
	// Zero means none (the link still runs through the proxy).
	ReplicationLatency time.Duration
}

// SentinelSet is a private Redis Sentinel deployment: one master, one
// replica and three sentinels (quorum 2) on free loopback ports, all
// started from redis-server, without persistence, and torn down when the
// test ends.
type SentinelSet struct {
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
	// Master and Replica are the data servers as started; after a failover
	// the replica is the master.
	Master, Replica *RedisServer
	// SentinelAddrs are the sentinels' addresses, for
	// redis.FailoverOptions.SentinelAddrs.
	SentinelAddrs []string
	// Link is the replication link: the replica replicates from the master
	// through it.
	Link *FaultProxy

	t testing.TB
}

// sentinelFailoverTimeout is the sentinels' failover-timeout. Besides
// bounding a failover, it delays Sentinel's "fix-slave-config" (which would
// point the replica straight at the master, past Link) to twice this long
// after the set starts: longer than any test runs.
const sentinelFailoverTimeout = 30 * time.Second

// StartSentinelSet starts a SentinelSet and waits until every sentinel
// knows the master, the replica and the two other sentinels, and the
// replica is in sync, so that a failover can start as soon as the master
// fails.
func StartSentinelSet(t testing.TB, opts SentinelOptions) *SentinelSet {
	t.Helper()
	master := StartRedis(t, "--repl-diskless-sync-delay", "0")
	link := StartFaultProxy(t, master.Addr)
	link.SetLatency(opts.ReplicationLatency)
	_, linkPort, _ := net.SplitHostPort(link.Addr)
	replica := StartRedis(t, "--replicaof", "127.0.0.1", linkPort)
	s := &SentinelSet{MasterName: "idem-" + strconv.Itoa(master.port), Master: master, Replica: replica, Link: link, t: t}

	bin, err := lookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		port := FreePort(t)
		addr := "127.0.0.1:" + strconv.Itoa(port)
		dir := t.TempDir()
		conf, log := filepath.Join(dir, "sentinel.conf"), filepath.Join(dir, "sentinel.log")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s 127.0.0.1 %d 2
sentinel down-after-milliseconds %s 500
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, dir, log, s.MasterName, master.port,
			s.MasterName, s.MasterName, sentinelFailoverTimeout.Milliseconds(), s.MasterName)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatalf("sentinel %d config: %v", i, err)
		}
		p, err := processSpec{what: fmt.Sprintf("sentinel %d on %s", i, addr), bin: bin, args: []string{conf, "--sentinel"}, log: log}.start()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.kill)
		if err := p.listening(addr, redisStartTimeout); err != nil {
			t.Fatal(err)
		}
		s.SentinelAddrs = append(s.SentinelAddrs, addr)
	}
	s.waitReady()
	return s
}

// waitReady waits until the replica is in sync and every sentinel sees the
// replica and both other sentinels.
func (s *SentinelSet) waitReady() {
	t := s.t
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	replica := redis.NewClient(&redis.Options{Addr: s.Replica.Addr, ContextTimeoutEnabled: true})
	defer replica.Close()
	for {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && containsLine(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s never synced: %v\n%s", s.Replica.Addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, addr := range s.SentinelAddrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		for {
			replicas, rerr := sc.Replicas(ctx, s.MasterName).Result()
			others, serr := sc.Sentinels(ctx, s.MasterName).Result()
			if rerr == nil && serr == nil && len(replicas) == 1 && len(others) == 2 && !containsFlag(replicas[0], "disconnected") {
				break
			}
			if time.Now().After(deadline) {
				_ = sc.Close()
				t.Fatalf("sentinel %s not ready: replicas %v (%v), sentinels %d (%v)", addr, replicas, rerr, len(others), serr)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = sc.Close()
	}
}

// KillMaster crashes the master (SIGKILL) and resets its replication link
// at the same moment, so that whatever the link still held never reaches
// the replica: a crash of a primary whose replica lags.
func (s *SentinelSet) KillMaster() {
	s.Link.Partition()
	s.Master.Stop()
	s.Link.ResetAll()
}

// WaitFailover waits until every sentinel names the replica as the master,
// and the replica says it is one; it returns the new master's address.
func (s *SentinelSet) WaitFailover(timeout time.Duration) string {
	t := s.t
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for _, addr := range s.SentinelAddrs {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		for {
			got, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
			if err == nil && len(got) == 2 && got[0]+":"+got[1] == s.Replica.Addr {
				break
			}
			if time.Now().After(deadline) {
				_ = sc.Close()
				t.Fatalf("sentinel %s: no failover to %s within %v: %v %v", addr, s.Replica.Addr, timeout, got, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = sc.Close()
	}
	c := redis.NewClient(&redis.Options{Addr: s.Replica.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && containsLine(info, "role:master") {
			return s.Replica.Addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became master: %v\n%s", s.Replica.Addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ReplicatesThroughLink reports whether the replica still replicates from
// the master through Link (Sentinel has not pointed it elsewhere).
func (s *SentinelSet) ReplicatesThroughLink() bool {
	c := redis.NewClient(&redis.Options{Addr: s.Replica.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	_, port, _ := net.SplitHostPort(s.Link.Addr)
	return err == nil && containsLine(info, "master_port:"+port) && containsLine(info, "master_link_status:up")
}

func containsLine(info, line string) bool {
	for _, l := range strings.Split(info, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

func containsFlag(fields map[string]string, flag string) bool {
	return slices.Contains(strings.Split(fields["flags"], ","), flag)
}
