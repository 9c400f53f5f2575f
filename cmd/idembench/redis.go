package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
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
)

// Ceiling is what the Redis under test does with our scripts alone.
type Ceiling struct {
	ClaimSHA  string `json:"claim_sha"`
	FinishSHA string `json:"finish_sha"`
	Clients   int    `json:"clients"`
	// RedisBenchmarkClaims is redis-benchmark -c Clients -P 1 EVALSHA of
	// the claim script on random fresh keys, per second (0 when
	// redis-benchmark is not on PATH).
	RedisBenchmarkClaims float64 `json:"redis_benchmark_claims"`
	// GoClaims is the same load from Clients goroutines of a raw go-redis
	// client (no middleware, no store code), per second.
	GoClaims float64 `json:"go_claims"`
	// GoMessages is claim+complete pairs (one fresh message each) from
	// Clients goroutines of a raw go-redis client, per second.
	GoMessages float64 `json:"go_messages"`
	// MessageCeiling is RedisBenchmarkClaims/2 (a fresh message costs two
	// script calls), or GoClaims/2 without redis-benchmark.
	MessageCeiling float64 `json:"message_ceiling"`
	// Pipeline is the depth of the pipelined run (-P), and
	// RedisBenchmarkClaimsPipelined its claims per second: redis-benchmark
	// -c Clients -P Pipeline, same script and keys (0 without
	// redis-benchmark).
	Pipeline                      int     `json:"pipeline"`
	RedisBenchmarkClaimsPipelined float64 `json:"redis_benchmark_claims_pipelined"`
	// MessageCeilingPipelined is RedisBenchmarkClaimsPipelined/2.
	MessageCeilingPipelined float64 `json:"message_ceiling_pipelined"`
	Note                    string  `json:"note,omitempty"`
}

// shaRecorder captures the SHA of every EVALSHA a client sends, and counts
// the commands and round trips it sends: a Process call is one command and
// one round trip, a ProcessPipeline call (a pipeline or a transaction) is
// one round trip carrying each of its commands.
type shaRecorder struct {
	mu         sync.Mutex
	shas       []string
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
			r.recordSHA(cmd)
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
				r.recordSHA(cmd)
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

func (r *shaRecorder) recordSHA(cmd redis.Cmder) {
	if args := cmd.Args(); len(args) > 1 && strings.EqualFold(fmt.Sprint(args[0]), "evalsha") {
		r.mu.Lock()
		r.shas = append(r.shas, fmt.Sprint(args[1]))
		r.mu.Unlock()
	}
}

// counts returns the commands and round trips counted so far.
func (r *shaRecorder) counts() (commands, roundTrips int64) {
	return r.commands.Load(), r.roundTrips.Load()
}

// scriptSHAs learns the SHAs of the claim and finish scripts by watching the
// store send them: one claim and one complete on a throwaway key.
func scriptSHAs(addr, prefix string) (claim, finish string) {
	rec := &shaRecorder{}
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
	defer c.Close()
	c.AddHook(rec)
	s := newRedisStore(c, true)
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

// ceilingClients is the concurrency of the ceiling, and ceilingPipeline the
// depth of its pipelined run.
const (
	ceilingClients  = 64
	ceilingPipeline = 16
)

func runCeiling(o options, rc *redis.Client) Ceiling {
	ctx := context.Background()
	ce := Ceiling{Clients: ceilingClients, Pipeline: ceilingPipeline}
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

	var notes []string
	rb := func(pipeline int, expected float64) float64 {
		// redis-benchmark stops by count only: about o.ceilingDur at the
		// expected rate.
		n := max(10_000, int(o.ceilingDur.Seconds()*expected))
		rps, err := redisBenchmark(o.redisAddr, redisBenchmarkArgs(o.prefix+":rb:", ce.ClaimSHA, leaseMs, ttlMs, pipeline, n))
		cleanup(rc, o.prefix+":rb:")
		if err != nil {
			notes = append(notes, fmt.Sprintf("redis-benchmark -P %d: %v", pipeline, err))
		}
		return rps
	}
	ce.RedisBenchmarkClaims = rb(1, 60_000)
	if ce.RedisBenchmarkClaims > 0 {
		ce.MessageCeiling = ce.RedisBenchmarkClaims / 2
		// Pipelining multiplies the rate by a few on one Redis core.
		ce.RedisBenchmarkClaimsPipelined = rb(ceilingPipeline, 3*ce.RedisBenchmarkClaims)
		ce.MessageCeilingPipelined = ce.RedisBenchmarkClaimsPipelined / 2
	} else {
		ce.MessageCeiling = ce.GoClaims / 2
		notes = append(notes, "ceiling from the Go load generator; no pipelined ceiling")
	}
	ce.Note = strings.Join(notes, "; ")
	return ce
}

// redisBenchmarkArgs are the arguments of redis-benchmark after its address:
// ceilingClients clients sending n EVALSHA of the claim script, pipeline
// deep, each on a random fresh key under prefix, with CSV output.
func redisBenchmarkArgs(prefix, sha, leaseMs, ttlMs string, pipeline, n int) []string {
	return []string{"-c", strconv.Itoa(ceilingClients), "-P", strconv.Itoa(pipeline), "-n", strconv.Itoa(n),
		"-r", "1000000000", "--csv",
		"EVALSHA", sha, "1", prefix + "__rand_int__", "0123456789abcdef0123456789abcdef", leaseMs, ttlMs, ""}
}

// redisBenchmark runs redis-benchmark against addr with args and returns its
// requests per second.
func redisBenchmark(addr string, args []string) (float64, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, errors.New("redis-benchmark not on PATH")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	out, err := exec.Command(bin, append([]string{"-h", host, "-p", port}, args...)...).Output()
	if err != nil {
		return 0, err
	}
	return parseRedisBenchmarkCSV(out)
}

// parseRedisBenchmarkCSV reads the requests per second of the last test in
// redis-benchmark --csv output: a row per test, its name then its rate
// (Redis 7 puts a header row "test","rps",... first).
func parseRedisBenchmarkCSV(out []byte) (float64, error) {
	r := csv.NewReader(bytes.NewReader(out))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil || len(recs) == 0 || len(recs[len(recs)-1]) < 2 {
		return 0, fmt.Errorf("output not understood: %q", out)
	}
	rps, err := strconv.ParseFloat(recs[len(recs)-1][1], 64)
	if err != nil || rps <= 0 {
		return 0, fmt.Errorf("rps %q not understood", recs[len(recs)-1][1])
	}
	return rps, nil
}

// Stats are measured on a private redis-server, so that other clients of
// the shared one cannot disturb the counts.
type Stats struct {
	Server string `json:"server"`
	// Messages is the number of messages of each measurement.
	Messages int `json:"messages"`
	// Cost holds the commands and round trips per message of each load, at
	// each concurrency, with the store's auto-pipelining off and on.
	Cost []Cost `json:"cost"`
	// FreshScriptInner counts the commands the scripts ran inside Redis per
	// fresh message; they are not round trips.
	FreshScriptInner float64 `json:"fresh_script_inner"`
	// Commands per message of handlers slower and faster than lease/3.
	SlowHandler Renewals `json:"slow_handler"`
	FastHandler Renewals `json:"fast_handler"`
	// Bytes per COMPLETED key: MEMORY USAGE averaged over the keys, and the
	// growth of used_memory (which also counts the expiry entry) per key.
	KeyBytes             int     `json:"key_bytes"`
	MemoryNoOutput       float64 `json:"memory_no_output"`
	UsedMemoryNoOutput   float64 `json:"used_memory_no_output"`
	MemoryWithOutput     float64 `json:"memory_with_output"`
	UsedMemoryWithOutput float64 `json:"used_memory_with_output"`
	// OutputBytes is the size of the stored value of a key with output.
	OutputBytes int    `json:"output_bytes"`
	Encoding    string `json:"encoding"`
	Note        string `json:"note,omitempty"`
}

// The loads of Cost.
const (
	// loadFresh: keys never seen before (claim, handler, complete).
	loadFresh = "fresh"
	// loadDupNoCache: the same keys again through a middleware whose local
	// cache is off, so that every duplicate asks Redis (the claim finds the
	// key COMPLETED).
	loadDupNoCache = "duplicate-nocache"
	// loadDupWarm: the same keys again through the middleware that
	// completed them (cache on), after one more unmeasured pass over them,
	// so that its local cache holds every one.
	loadDupWarm = "duplicate-warm"
)

// Cost is what one load costs in Redis per message.
type Cost struct {
	Load           string `json:"load"`
	AutoPipelining bool   `json:"auto_pipelining"`
	Concurrency    int    `json:"concurrency"`
	// ServerCommands is counted by Redis: INFO commandstats deltas of
	// top-level commands (EVALSHA and EVAL, and any command that our scripts
	// do not call themselves) per message.
	ServerCommands float64 `json:"server_commands"`
	// ClientCommands and RoundTrips are counted by a go-redis hook on the
	// store's client: a Process call is one command and one round trip, a
	// ProcessPipeline call one round trip carrying its commands.
	ClientCommands float64 `json:"client_commands"`
	RoundTrips     float64 `json:"round_trips"`
	// CacheHits and CacheMisses count the lookups of the middleware's local
	// cache during the measurement.
	CacheHits   uint64 `json:"cache_hits"`
	CacheMisses uint64 `json:"cache_misses"`
}

// Renewals describes a handler run under a short lease.
type Renewals struct {
	Lease              string  `json:"lease"`
	Handler            string  `json:"handler"`
	CommandsPerMessage float64 `json:"commands_per_message"`
}

// scriptInner are the commands our scripts call; anything else in
// commandstats was sent by a client.
var scriptInner = map[string]bool{"hmget": true, "hset": true, "hget": true, "hdel": true, "time": true, "pexpire": true,
	"set": true, "get": true, "del": true, "pexpireat": true, "exists": true, "type": true, "hgetall": true}

func runStats(o options) Stats {
	st := Stats{Server: "private redis-server", Messages: o.statsKeys}
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
	poolSize := max(8, 2*maxInt(o.concurrency))
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, PoolSize: poolSize})
	defer c.Close()
	b := &statsBench{o: o, c: c, rec: &shaRecorder{}, prefix: prefix}
	c.AddHook(b.rec)
	warmPool(c, poolSize)

	// Memory first, on a server that has seen nothing else.
	b.memory(&st)
	for _, pipelining := range []bool{false, true} {
		for _, conc := range o.concurrency {
			st.Cost = append(st.Cost, b.cost(pipelining, conc)...)
		}
	}
	for _, x := range b.freshInner {
		st.FreshScriptInner = max(st.FreshScriptInner, x)
	}
	st.SlowHandler = renewals(c, b.rec, prefix, 300*time.Millisecond, 250*time.Millisecond)
	st.FastHandler = renewals(c, b.rec, prefix, 300*time.Millisecond, 50*time.Millisecond)
	cleanup(c, prefix+":")
	return st
}

// statsBench measures on the stats section's server, through a client
// whose commands rec counts.
type statsBench struct {
	o      options
	c      *redis.Client
	rec    *shaRecorder
	prefix string
	// freshInner holds the commands run inside the scripts per fresh
	// message, of each fresh cell.
	freshInner []float64
}

func (b *statsBench) config(s idempotency.Store) idempotency.Config {
	return idempotency.Config{Store: s, KeyPrefix: b.prefix, Scope: func(*message.Message) string { return "orders" }}
}

func (b *statsBench) storedKey(k string) string { return b.prefix + ":orders:" + k }

func (b *statsBench) newKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = watermill.NewUUID()
	}
	return keys
}

// send passes one message per key through chain, from conc goroutines.
func (b *statsBench) send(chain message.HandlerFunc, conc int, keys []string) {
	forEach(conc, keys, func(k string) {
		if _, err := chain(message.NewMessage(k, nil)); err != nil {
			log.Fatal(err)
		}
	})
}

// memory measures the bytes per COMPLETED key, without and with a stored
// output, with the defaults, one message at a time.
func (b *statsBench) memory(st *Stats) {
	ctx, n := context.Background(), b.o.statsKeys
	idem := newIdempotency(b.config(newRedisStore(b.c, false)), false)
	chain := idem.Middleware(noop)
	// One message first, so that the scripts are loaded: their memory is
	// not the keys'.
	b.send(chain, 1, b.newKeys(1))
	keys := b.newKeys(n)
	used0 := usedMemory(b.c)
	b.send(chain, 1, keys)
	used1 := usedMemory(b.c)
	st.KeyBytes = len(b.storedKey(keys[0]))
	st.MemoryNoOutput = avgMemory(b.c, keys, b.storedKey)
	st.UsedMemoryNoOutput = float64(used1-used0) / float64(n)
	st.Encoding, _ = b.c.ObjectEncoding(ctx, b.storedKey(keys[0])).Result()

	// The same with one produced message stored as output.
	withOutput := idem.Middleware(func(m *message.Message) ([]*message.Message, error) {
		out := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"A-1042","status":"paid","amount":1999}`))
		out.Metadata.Set("requestId", m.UUID)
		return []*message.Message{out}, nil
	})
	outKeys := b.newKeys(n)
	used2 := usedMemory(b.c)
	b.send(withOutput, 1, outKeys)
	used3 := usedMemory(b.c)
	st.MemoryWithOutput = avgMemory(b.c, outKeys, b.storedKey)
	st.UsedMemoryWithOutput = float64(used3-used2) / float64(n)
	if size, err := b.c.StrLen(ctx, b.storedKey(outKeys[0])).Result(); err == nil {
		st.OutputBytes = int(size)
	}
}

// cost measures each load's commands and round trips per message, with
// auto-pipelining on or off, from conc goroutines: statsKeys fresh
// messages, the same keys again as duplicates through a middleware without
// its local cache, then through the one that completed them, once to warm
// its cache and once measured.
func (b *statsBench) cost(pipelining bool, conc int) []Cost {
	store := newRedisStore(b.c, !pipelining)
	cached, uncached := newIdempotency(b.config(store), false), newIdempotency(b.config(store), true)
	chain, uncachedChain := cached.Middleware(noop), uncached.Middleware(noop)
	// One message first through each, so that the scripts are loaded and
	// nothing after this pays a NOSCRIPT round trip.
	b.send(chain, 1, b.newKeys(1))
	b.send(uncachedChain, 1, b.newKeys(1))
	n := b.o.statsKeys
	measure := func(load string, idem *idempotency.Idempotency, f func()) Cost {
		hits0, misses0 := cacheCounts(idem)
		before := commandStats(b.c)
		cb, rb := b.rec.counts()
		dials0 := b.rec.dials.Load()
		f()
		ca, ra := b.rec.counts()
		dials := b.rec.dials.Load() - dials0
		after := commandStats(b.c)
		hits, misses := cacheCounts(idem)
		var top, in int64
		for cmd, calls := range after {
			d := calls - before[cmd]
			switch {
			case cmd == "info" || connectionSetup[cmd]: // our own snapshots, new connections
			case scriptInner[cmd]:
				in += d
			default:
				top += d
			}
		}
		if load == loadFresh {
			b.freshInner = append(b.freshInner, float64(in)/float64(n))
		}
		b.o.logf("cost %s auto-pipelining %v c=%d: %d top-level and %d inner commands (Redis), %d commands and %d round trips (client), %d connections opened, %v",
			load, pipelining, conc, top, in, ca-cb, ra-rb, dials, cmdDeltas(before, after))
		return Cost{Load: load, AutoPipelining: pipelining, Concurrency: conc,
			ServerCommands: float64(top) / float64(n), ClientCommands: float64(ca-cb) / float64(n), RoundTrips: float64(ra-rb) / float64(n),
			CacheHits: hits - hits0, CacheMisses: misses - misses0}
	}
	keys := b.newKeys(n)
	out := []Cost{
		measure(loadFresh, cached, func() { b.send(chain, conc, keys) }),
		measure(loadDupNoCache, uncached, func() { b.send(uncachedChain, conc, keys) }),
	}
	b.send(chain, conc, keys) // the cache now holds every key
	return append(out, measure(loadDupWarm, cached, func() { b.send(chain, conc, keys) }))
}

// forEach calls f once for each key, from conc goroutines.
func forEach(conc int, keys []string, f func(string)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(conc, len(keys)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				f(keys[i])
			}
		})
	}
	wg.Wait()
}

// renewals runs 8 messages, concurrently, through a handler that takes d
// under a lease of lease, and returns the client's commands per message.
func renewals(c *redis.Client, rec *shaRecorder, prefix string, lease, d time.Duration) Renewals {
	idem := newIdempotency(idempotency.Config{Store: newRedisStore(c, false), KeyPrefix: prefix, LeaseTTL: lease}, false)
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
