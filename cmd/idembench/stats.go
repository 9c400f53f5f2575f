package main

import (
	"context"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

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

// Cost is what one load costs in Redis per message.
type Cost struct {
	// Load is loadFresh, loadDupNoCache or loadDupWarm.
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
		prefix = o.prefix + "-st"
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
	st.SlowHandler = b.renewals(300*time.Millisecond, 250*time.Millisecond)
	st.FastHandler = b.renewals(300*time.Millisecond, 50*time.Millisecond)
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

func (b *statsBench) config(s idempotency.Store) idemConfig {
	return idemConfig{Store: s, KeyPrefix: b.prefix, Scope: func(*message.Message) string { return "orders" }}
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

// The loads of Cost, measured by statsBench.cost.
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
	measure := func(load string, idem *idempotency.Middleware, f func()) Cost {
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

// renewals runs 8 messages at once through a handler that takes d under a
// lease of lease, and returns the client's commands per message.
func (b *statsBench) renewals(lease, d time.Duration) Renewals {
	idem := newIdempotency(idemConfig{Store: newRedisStore(b.c, false), KeyPrefix: b.prefix, LeaseTTL: lease}, false)
	chain := idem.Middleware(func(*message.Message) ([]*message.Message, error) { time.Sleep(d); return nil, nil })
	// One message first, so that every script (renew included) is loaded on
	// the server: a first call answers NOSCRIPT and is sent again with EVAL,
	// which is not a per-message cost.
	if _, err := chain(message.NewMessage(watermill.NewUUID(), nil)); err != nil {
		log.Print(err)
	}
	const n = 8
	before := b.rec.commands.Load()
	forEach(n, b.newKeys(n), func(k string) {
		if _, err := chain(message.NewMessage(k, nil)); err != nil {
			log.Print(err)
		}
	})
	return Renewals{Lease: lease.String(), Handler: d.String(), CommandsPerMessage: float64(b.rec.commands.Load()-before) / n}
}
