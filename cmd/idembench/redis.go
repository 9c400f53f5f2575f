package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
)

// shaRecorder counts the commands and round trips it sends: a Process call is one command and
// one round trip, a ProcessPipeline call (a pipeline or a transaction) is
// one round trip carrying each of its commands.
type shaRecorder struct {
	commands   atomic.Int64
	roundTrips atomic.Int64
	dials      atomic.Int64
}

func (r *shaRecorder) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		r.dials.Add(1)
		return next(ctx, network, addr)
	}
}
func (r *shaRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !connectionSetup[cmd.Name()] {
			r.commands.Add(1)
			r.roundTrips.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (r *shaRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var n int64
		for _, cmd := range cmds {
			if !connectionSetup[cmd.Name()] {
				n++
			}
		}
		if n > 0 {
			r.commands.Add(n)
			r.roundTrips.Add(1)
		}
		return next(ctx, cmds)
	}
}

// connectionSetup are the commands go-redis sends when it opens a
// connection: a cost per connection, not per message, left out of the
// counts (a client whose pool grows mid-measurement sends them).
var connectionSetup = map[string]bool{"hello": true, "client": true, "client|setinfo": true, "auth": true, "select": true}

// counts returns the commands and round trips counted so far.
func (r *shaRecorder) counts() (commands, roundTrips int64) {
	return r.commands.Load(), r.roundTrips.Load()
}

// cmdDeltas returns the commands whose calls changed from before to after,
// with the change.
func cmdDeltas(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for cmd, calls := range after {
		if calls != before[cmd] {
			d[cmd] = calls - before[cmd]
		}
	}
	return d
}

// commandStats returns calls per command from INFO commandstats.
func commandStats(c *redis.Client) map[string]int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		log.Fatal(err)
	}
	m := map[string]int64{}
	for name, st := range parseCommandStats(info) {
		m[name] = st.Calls
	}
	return m
}

// usedMemory returns used_memory from INFO memory.
func usedMemory(c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		log.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// avgMemory returns the mean MEMORY USAGE of the stored keys of keys.
func avgMemory(c *redis.Client, keys []string, stored func(string) string) float64 {
	ctx := context.Background()
	var sum int64
	for _, k := range keys {
		n, err := c.MemoryUsage(ctx, stored(k), 0).Result()
		if err != nil {
			log.Fatalf("MEMORY USAGE %s: %v", stored(k), err)
		}
		sum += n
	}
	return float64(sum) / float64(len(keys))
}

// cleanup deletes every key under prefix, and logs a failure: what a run
// leaves behind is not worth stopping it for.
func cleanup(rc *redis.Client, prefix string) {
	if err := rediskeys.Delete(context.Background(), rc, prefix+"*"); err != nil {
		log.Printf("clean up: %v", err)
	}
}

// startRedis starts a private redis-server without persistence on a free
// loopback port.
func startRedis() (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "idembench-redis")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			_ = conn.Close()
			return addr, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("redis-server on %s did not start", addr)
}
