package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// Ceiling is what the Redis under test does with our scripts alone.
type Ceiling struct {
	ClaimSHA, FinishSHA string
	Clients             int
	// RedisBenchmarkClaims is redis-benchmark -c Clients -P 1 EVALSHA of
	// the claim script on random fresh keys, per second (0 when
	// redis-benchmark is not on PATH).
	RedisBenchmarkClaims float64
	// GoClaims is the same load from Clients goroutines of a raw go-redis
	// client (no middleware, no store code), per second.
	GoClaims float64
	// GoMessages is claim+complete pairs (one fresh message each) from
	// Clients goroutines of a raw go-redis client, per second.
	GoMessages float64
	// MessageCeiling is RedisBenchmarkClaims/2 (a fresh message costs two
	// script calls), or GoClaims/2 without redis-benchmark.
	MessageCeiling float64
	Note           string `json:",omitempty"`
}

// shaRecorder captures the SHA of every EVALSHA a client sends, and counts
// the commands it sends.
type shaRecorder struct {
	mu       sync.Mutex
	shas     []string
	commands atomic.Int64
}

func (r *shaRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *shaRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.commands.Add(1)
		if args := cmd.Args(); len(args) > 1 && strings.EqualFold(fmt.Sprint(args[0]), "evalsha") {
			r.mu.Lock()
			r.shas = append(r.shas, fmt.Sprint(args[1]))
			r.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (r *shaRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.commands.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// scriptSHAs learns the SHAs of the claim and finish scripts by watching the
// store send them: one claim and one complete on a throwaway key.
func scriptSHAs(addr, prefix string) (claim, finish string) {
	rec := &shaRecorder{}
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
	defer c.Close()
	c.AddHook(rec)
	s, err := redisstore.New(c)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	key := prefix + ":sha"
	token := idempotency.NewToken()
	if _, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute}); err != nil {
		log.Fatalf("Redis at %s: %v", addr, err)
	}
	if err := s.Complete(ctx, key, token, nil, time.Minute); err != nil {
		log.Fatal(err)
	}
	_ = s.Delete(ctx, key)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.shas) < 2 {
		log.Fatalf("saw %d EVALSHA, want claim and complete", len(rec.shas))
	}
	return rec.shas[0], rec.shas[len(rec.shas)-1]
}

const ceilingClients = 64

func runCeiling(o options, rc *redis.Client) Ceiling {
	ctx := context.Background()
	ce := Ceiling{Clients: ceilingClients}
	ce.ClaimSHA, ce.FinishSHA = scriptSHAs(o.redisAddr, o.prefix)
	warmPool(rc, 2*ceilingClients)
	leaseMs := strconv.FormatInt(idempotency.DefaultLeaseTTL.Milliseconds(), 10)
	ttlMs := strconv.FormatInt(time.Hour.Milliseconds(), 10)

	var seq atomic.Uint64
	key := func() string { return o.prefix + ":ceil:" + strconv.FormatUint(seq.Add(1), 10) }
	n, secs := hammer(ceilingClients, o.ceilingDur, func() error {
		return rc.EvalSha(ctx, ce.ClaimSHA, []string{key()}, "0123456789abcdef0123456789abcdef", leaseMs, ttlMs, "").Err()
	})
	ce.GoClaims = float64(n) / secs
	cleanup(rc, o.prefix+":ceil:")

	n, secs = hammer(ceilingClients, o.ceilingDur, func() error {
		k, tok := key(), "0123456789abcdef0123456789abcdef"
		if err := rc.EvalSha(ctx, ce.ClaimSHA, []string{k}, tok, leaseMs, ttlMs, "").Err(); err != nil {
			return err
		}
		return rc.EvalSha(ctx, ce.FinishSHA, []string{k}, tok, ttlMs, "").Err()
	})
	ce.GoMessages = float64(n) / secs
	cleanup(rc, o.prefix+":ceil:")

	ce.RedisBenchmarkClaims, ce.Note = redisBenchmark(o, ce.ClaimSHA, leaseMs, ttlMs)
	cleanup(rc, o.prefix+":rb:")
	if ce.RedisBenchmarkClaims > 0 {
		ce.MessageCeiling = ce.RedisBenchmarkClaims / 2
	} else {
		ce.MessageCeiling = ce.GoClaims / 2
	}
	return ce
}

// redisBenchmark runs redis-benchmark with 64 clients, no pipelining, on the
// claim script with random fresh keys, and returns its requests per second.
func redisBenchmark(o options, sha, leaseMs, ttlMs string) (float64, string) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, "redis-benchmark not on PATH; ceiling from the Go load generator"
	}
	host, port, err := net.SplitHostPort(o.redisAddr)
	if err != nil {
		return 0, err.Error()
	}
	// About o.ceilingDur at 60k/s; redis-benchmark stops by count only.
	n := int(o.ceilingDur.Seconds() * 60_000)
	cmd := exec.Command(bin, "-h", host, "-p", port, "-c", strconv.Itoa(ceilingClients), "-P", "1", "-n", strconv.Itoa(n),
		"-r", "1000000000", "--csv",
		"EVALSHA", sha, "1", o.prefix+":rb:__rand_int__", "0123456789abcdef0123456789abcdef", leaseMs, ttlMs, "")
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Sprintf("redis-benchmark: %v", err)
	}
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[1]) < 2 {
		return 0, fmt.Sprintf("redis-benchmark output not understood: %q", out)
	}
	rps, err := strconv.ParseFloat(recs[len(recs)-1][1], 64)
	if err != nil {
		return 0, fmt.Sprintf("redis-benchmark rps %q: %v", recs[len(recs)-1][1], err)
	}
	return rps, ""
}

// Stats are measured on a private redis-server, so that other clients of
// the shared one cannot disturb the counts.
type Stats struct {
	Server string
	// Commands per message counted by Redis (INFO commandstats deltas of
	// top-level commands: EVALSHA and EVAL, plus any command that our
	// scripts do not call themselves), and by the client (a go-redis hook).
	FreshServer, FreshClient         float64
	DuplicateServer, DuplicateClient float64
	// ScriptInner counts the commands the scripts ran inside Redis per
	// fresh message; they are not round trips.
	FreshScriptInner float64
	// Commands per message of handlers slower and faster than lease/3.
	SlowHandler, FastHandler Renewals
	// Bytes per COMPLETED key: MEMORY USAGE averaged over the keys, and the
	// growth of used_memory (which also counts the expiry entry) per key.
	KeyBytes             int
	MemoryNoOutput       float64
	UsedMemoryNoOutput   float64
	MemoryWithOutput     float64
	UsedMemoryWithOutput float64
	// OutputBytes is the size of the stored value of a key with output.
	OutputBytes int
	Encoding    string
	Note        string `json:",omitempty"`
}

// Renewals describes a handler run under a short lease.
type Renewals struct {
	Lease, Handler     string
	CommandsPerMessage float64
}

// scriptInner are the commands our scripts call; anything else in
// commandstats was sent by a client.
var scriptInner = map[string]bool{"hmget": true, "hset": true, "hget": true, "hdel": true, "time": true, "pexpire": true,
	"set": true, "get": true, "del": true, "pexpireat": true, "exists": true, "type": true, "hgetall": true}

func runStats(o options) Stats {
	st := Stats{Server: "private redis-server"}
	addr, stop, err := startRedis()
	if err != nil {
		st.Server, st.Note = "shared "+o.redisAddr, "no private redis-server ("+err.Error()+"): counts include other clients"
		addr, stop = o.redisAddr, func() {}
	}
	defer stop()
	// Keys as a service would have them on its own server: idem:orders:<uuid>.
	prefix := "idem"
	if st.Note != "" {
		prefix = o.prefix + ":st"
	}
	rec := &shaRecorder{}
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, PoolSize: 8})
	defer c.Close()
	c.AddHook(rec)
	ctx := context.Background()
	warmPool(c, 8)
	store, err := redisstore.New(c)
	if err != nil {
		log.Fatal(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, KeyPrefix: prefix,
		Scope: func(*message.Message) string { return "orders" }}, nil)
	if err != nil {
		log.Fatal(err)
	}
	chain := idem.Middleware(noop)
	n := o.statsKeys
	keys := make([]string, n)
	for i := range keys {
		keys[i] = watermill.NewUUID()
	}
	// One message first, so that the scripts are loaded and nothing after
	// this pays a NOSCRIPT round trip.
	if _, err := chain(message.NewMessage(watermill.NewUUID(), nil)); err != nil {
		log.Fatal(err)
	}

	measure := func(f func()) (server, client, inner float64) {
		before, cb := commandStats(c), rec.commands.Load()
		f()
		after, ca := commandStats(c), rec.commands.Load()
		var top, in int64
		for cmd, calls := range after {
			d := calls - before[cmd]
			switch {
			case cmd == "info": // our own snapshots
			case scriptInner[cmd]:
				in += d
			default:
				top += d
			}
		}
		return float64(top) / float64(n), float64(ca-cb-1) / float64(n), float64(in) / float64(n)
	}
	used0 := usedMemory(c)
	st.FreshServer, st.FreshClient, st.FreshScriptInner = measure(func() {
		for _, k := range keys {
			if _, err := chain(message.NewMessage(k, nil)); err != nil {
				log.Fatal(err)
			}
		}
	})
	used1 := usedMemory(c)
	st.DuplicateServer, st.DuplicateClient, _ = measure(func() {
		for _, k := range keys {
			if _, err := chain(message.NewMessage(k, nil)); err != nil {
				log.Fatal(err)
			}
		}
	})
	storedKey := func(k string) string { return prefix + ":orders:" + k }
	st.KeyBytes = len(storedKey(keys[0]))
	st.MemoryNoOutput = avgMemory(c, keys, storedKey)
	st.UsedMemoryNoOutput = float64(used1-used0) / float64(n)
	st.Encoding, _ = c.ObjectEncoding(ctx, storedKey(keys[0])).Result()

	// The same with one produced message stored as output.
	outKeys := make([]string, n)
	for i := range outKeys {
		outKeys[i] = watermill.NewUUID()
	}
	withOutput := idem.Middleware(func(m *message.Message) ([]*message.Message, error) {
		out := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"A-1042","status":"paid","amount":1999}`))
		out.Metadata.Set("requestId", m.UUID)
		return []*message.Message{out}, nil
	})
	used2 := usedMemory(c)
	for _, k := range outKeys {
		if _, err := withOutput(message.NewMessage(k, nil)); err != nil {
			log.Fatal(err)
		}
	}
	used3 := usedMemory(c)
	st.MemoryWithOutput = avgMemory(c, outKeys, storedKey)
	st.UsedMemoryWithOutput = float64(used3-used2) / float64(n)
	if n, err := c.StrLen(ctx, storedKey(outKeys[0])).Result(); err == nil {
		st.OutputBytes = int(n)
	}

	st.SlowHandler = renewals(c, rec, prefix, 300*time.Millisecond, 250*time.Millisecond)
	st.FastHandler = renewals(c, rec, prefix, 300*time.Millisecond, 50*time.Millisecond)
	cleanup(c, prefix+":")
	return st
}

// renewals runs 8 messages, concurrently, through a handler that takes d
// under a lease of lease, and returns the client's commands per message.
func renewals(c *redis.Client, rec *shaRecorder, prefix string, lease, d time.Duration) Renewals {
	store, err := redisstore.New(c)
	if err != nil {
		log.Fatal(err)
	}
	idem, err := idempotency.New(idempotency.Config{Store: store, KeyPrefix: prefix, LeaseTTL: lease}, nil)
	if err != nil {
		log.Fatal(err)
	}
	chain := idem.Middleware(func(*message.Message) ([]*message.Message, error) { time.Sleep(d); return nil, nil })
	// One message first, so that every script (renew included) is loaded on
	// the server: a first call answers NOSCRIPT and is sent again with EVAL,
	// which is not a per-message cost.
	if _, err := chain(message.NewMessage(watermill.NewUUID(), nil)); err != nil {
		log.Print(err)
	}
	const n = 8
	before := rec.commands.Load()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := chain(message.NewMessage(watermill.NewUUID(), nil)); err != nil {
				log.Print(err)
			}
		})
	}
	wg.Wait()
	return Renewals{Lease: lease.String(), Handler: d.String(), CommandsPerMessage: float64(rec.commands.Load()-before) / n}
}

// commandStats returns calls per command from INFO commandstats.
func commandStats(c *redis.Client) map[string]int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		log.Fatal(err)
	}
	m := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		m[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(calls, 10, 64)
	}
	return m
}

func usedMemory(c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

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
