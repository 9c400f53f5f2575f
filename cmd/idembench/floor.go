package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// Floor puts, on one private Redis, the commands our store sends per
// message beside the least a Redis deduplication can send: SET NX PX then
// SET XX PX for a fresh message, one GET for a duplicate.
type Floor struct {
	// OursClaim, OursComplete and OursDuplicate are the commands the store
	// sent for a fresh Claim, its Complete and the Claim of a COMPLETED
	// key, as captured and replayed.
	OursClaim     []string  `json:"ours_claim"`
	OursComplete  []string  `json:"ours_complete"`
	OursDuplicate []string  `json:"ours_duplicate"`
	Fresh         FloorPair `json:"fresh"`
	Duplicate     FloorPair `json:"duplicate"`
}

// FloorPair is one load, ours beside the floor. RateRatio is the median
// over the rounds of ours' rate over the floor's in the same round.
type FloorPair struct {
	Floor     FloorSide `json:"floor"`
	Ours      FloorSide `json:"ours"`
	RateRatio float64   `json:"rate_ratio"`
}

// FloorSide is one side of a pair: messages per second of each round and
// their median, and the CPU of Redis's main thread per message.
type FloorSide struct {
	Rates     []float64 `json:"rates"`
	PerSecond float64   `json:"per_second"`
	RedisCPU  float64   `json:"redis_cpu_usec"`
	messages  int64
	cpuUsec   float64
}

// The load: 64 connections, each sending pipelines of 16 commands (the
// redis-benchmark -c 64 -P 16 shape); duplicates cycle through dupKeys.
const (
	floorConns    = 64
	floorPipeline = 16
	dupKeys       = 8192
	floorLease    = time.Minute
	floorTTL      = 24 * time.Hour
)

// cmdTemplate is a command the store sent for a template key, to be sent
// again with only the key changed: keyAt are the positions of the key.
type cmdTemplate struct {
	args  []any
	keyAt []int
}

// newTemplate returns the template of a command sent for key. An argument
// that holds key inside a larger value cannot be replayed on other keys.
func newTemplate(args []any, key string) (cmdTemplate, error) {
	t := cmdTemplate{args: slices.Clone(args)}
	for i, a := range args {
		switch s := argString(a); {
		case s == key:
			t.keyAt = append(t.keyAt, i)
		case strings.Contains(s, key):
			return t, fmt.Errorf("argument %d of %v holds the key inside a larger value: it cannot be replayed", i, args[0])
		}
	}
	return t, nil
}

func (t cmdTemplate) with(key string) []any {
	args := slices.Clone(t.args)
	for _, i := range t.keyAt {
		args[i] = key
	}
	return args
}

// String shows the command with the key as <key> and long arguments cut.
func (t cmdTemplate) String() string {
	parts := make([]string, len(t.args))
	for i, a := range t.args {
		s := argString(a)
		switch {
		case slices.Contains(t.keyAt, i):
			s = "<key>"
		case i == 0:
			s = strings.ToUpper(s)
		case s == "" || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r > '~' }):
			s = strconv.Quote(s)
		}
		if len(s) > 40 {
			s = s[:40] + "…"
		}
		parts[i] = s
	}
	return strings.Join(parts, " ")
}

// argString is an argument as Redis receives it.
func argString(a any) string {
	if b, ok := a.([]byte); ok {
		return string(b)
	}
	return fmt.Sprint(a)
}

func templateStrings(ts []cmdTemplate) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.String()
	}
	return out
}

// capture is a go-redis hook that keeps the commands its client sends.
type capture struct {
	mu   sync.Mutex
	cmds []redis.Cmder
}

func (c *capture) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *capture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add(cmd); return next(ctx, cmd) }
}

func (c *capture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.add(cmds...); return next(ctx, cmds) }
}

func (c *capture) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		if !connectionSetup[cmd.Name()] {
			c.cmds = append(c.cmds, cmd)
		}
	}
}

// take returns the commands kept since the last take.
func (c *capture) take() []redis.Cmder {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmds := c.cmds
	c.cmds = nil
	return cmds
}

// connectionSetup are the commands go-redis sends when it opens a
// connection: not a cost per message.
var connectionSetup = map[string]bool{"hello": true, "client": true, "auth": true, "select": true}

// storeCommands are what a store sent for one fresh message (Claim, then
// Complete) and one duplicate (a Claim of a COMPLETED key).
type storeCommands struct{ claim, complete, duplicate []cmdTemplate }

// captureStore watches a redisstore on c's server claim and complete a
// fresh key, then claim it again with another token. A message and a
// duplicate on a key of their own go first, so that every script is loaded.
func captureStore(ctx context.Context, addr string) (storeCommands, error) {
	c := newClient(addr, 4)
	defer c.Close()
	rec := &capture{}
	c.AddHook(rec)
	s := newStore(c)
	token := storekit.NewToken()
	req := func(tok string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Token: tok, Lease: floorLease, TTL: floorTTL}
	}
	var out storeCommands
	for _, key := range []string{"capture:warm", "capture:template"} {
		res, err := s.Claim(ctx, key, req(token))
		if err != nil || !res.Acquired {
			return out, fmt.Errorf("claim of fresh key %s: acquired %v, %v", key, res.Acquired, err)
		}
		claim := rec.take()
		if err := s.Complete(ctx, key, token, nil, floorTTL); err != nil {
			return out, err
		}
		complete := rec.take()
		res, err = s.Claim(ctx, key, req(storekit.NewToken()))
		if err != nil || res.Acquired || res.Record.State != idempotency.StateCompleted {
			return out, fmt.Errorf("claim of COMPLETED key %s: acquired %v, state %v, %v", key, res.Acquired, res.Record.State, err)
		}
		dup := rec.take()
		if key == "capture:warm" {
			continue // it may have loaded a script: not a cost per message
		}
		for _, x := range []struct {
			cmds []redis.Cmder
			into *[]cmdTemplate
		}{{claim, &out.claim}, {complete, &out.complete}, {dup, &out.duplicate}} {
			if *x.into, err = templates(ctx, c, x.cmds, key); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// templates turns the commands of one store call on key into templates.
// Each must have succeeded and touch no key but key (COMMAND GETKEYS), and
// one must name key: else a replay would not measure the store.
func templates(ctx context.Context, c *redis.Client, cmds []redis.Cmder, key string) ([]cmdTemplate, error) {
	var out []cmdTemplate
	named := false
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("the store sent %s, which failed: %w", cmd.Name(), err)
		}
		t, err := newTemplate(cmd.Args(), key)
		if err != nil {
			return nil, err
		}
		keys, _ := c.CommandGetKeys(ctx, cmd.Args()...).Result()
		if slices.ContainsFunc(keys, func(k string) bool { return k != key }) {
			return nil, fmt.Errorf("the store's %s touches keys %q besides %q", cmd.Name(), keys, key)
		}
		named = named || len(t.keyAt) > 0
		out = append(out, t)
	}
	if !named {
		return nil, fmt.Errorf("no command of the store names the key %q: %v", key, templateStrings(out))
	}
	return out, nil
}

// msgShape is what one message sends: first in one pipeline of its
// connection, then second in the next.
type msgShape struct {
	first, second []cmdTemplate
	nilOK         bool // a nil reply is an answer, not a key that was not what the load needs
}

// runLoad sends messages of shape on floorConns connections for d, each
// sending pipelines of floorPipeline commands, message i of connection w on
// key(w, i); a pipeline carries the first commands of new messages and the
// second of the previous pipeline's. It returns the messages of each
// connection and the rate.
func runLoad(ctx context.Context, c *redis.Client, d time.Duration, shape msgShape, key func(w, i int) string) (counts []int, perSecond, cpuUsec float64, err error) {
	cpu0, _ := redisCPU(ctx, c)
	counts = make([]int, floorConns)
	per := max(1, floorPipeline/(len(shape.first)+len(shape.second)))
	errs := make(chan error, floorConns)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range floorConns {
		wg.Go(func() {
			conn := c.Conn()
			defer conn.Close()
			var due []string // keys whose second commands are due
			for next := 0; ; {
				stopping := next > 0 && time.Since(start) > d
				if stopping && len(due) == 0 {
					return
				}
				p := conn.Pipeline()
				for _, k := range due {
					for _, t := range shape.second {
						p.Do(ctx, t.with(k)...)
					}
				}
				var started []string
				for ; !stopping && len(started) < per; next++ {
					started = append(started, key(w, next))
					for _, t := range shape.first {
						p.Do(ctx, t.with(key(w, next))...)
					}
				}
				cmds, _ := p.Exec(ctx)
				for _, cmd := range cmds {
					if err := cmd.Err(); err != nil && (!errors.Is(err, redis.Nil) || !shape.nilOK) {
						errs <- fmt.Errorf("%v: %w", cmd.Args(), err)
						return
					}
				}
				if len(shape.second) == 0 {
					counts[w] += len(started)
				} else {
					counts[w], due = counts[w]+len(due), started
				}
			}
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	close(errs)
	if err := <-errs; err != nil {
		return nil, 0, 0, err
	}
	cpu1, _ := redisCPU(ctx, c)
	var n int
	for _, x := range counts {
		n += x
	}
	return counts, float64(n) / secs, 1e6 * (cpu1 - cpu0), nil
}

// runFloor runs the floor section on a private redis-server.
func runFloor(ctx context.Context, o options) (Floor, error) {
	var fl Floor
	c, stop, err := startRedis()
	if err != nil {
		return fl, err
	}
	defer stop()
	ours, err := captureStore(ctx, c.Options().Addr)
	if err != nil {
		return fl, err
	}
	fl.OursClaim, fl.OursComplete, fl.OursDuplicate = templateStrings(ours.claim), templateStrings(ours.complete), templateStrings(ours.duplicate)
	store := newStore(c)

	tmpl := func(args ...any) []cmdTemplate {
		t, _ := newTemplate(args, "{key}")
		return []cmdTemplate{t}
	}
	floorFresh := msgShape{first: tmpl("set", "{key}", "1", "nx", "px", floorLease.Milliseconds()),
		second: tmpl("set", "{key}", "done", "xx", "px", floorTTL.Milliseconds())}
	oursFresh := msgShape{first: ours.claim, second: ours.complete, nilOK: true}
	for r := range o.floorRounds {
		for _, isOurs := range roundOrder(r) {
			shape, side := floorFresh, &fl.Fresh.Floor
			if isOurs {
				shape, side = oursFresh, &fl.Fresh.Ours
			}
			prefix := "r" + strconv.Itoa(r) + ":"
			key := func(w, i int) string { return prefix + strconv.Itoa(w) + ":" + strconv.Itoa(i) }
			counts, perSecond, cpu, err := runLoad(ctx, c, o.floorDur, shape, key)
			if err != nil {
				return fl, fmt.Errorf("fresh, ours %v: %w", isOurs, err)
			}
			// The first and last key of every connection ended COMPLETED.
			for w, n := range counts {
				for _, k := range []string{key(w, 0), key(w, n-1)} {
					if err := checkCompleted(ctx, c, store, isOurs, k); err != nil {
						return fl, err
					}
				}
			}
			side.add(counts, perSecond, cpu)
			o.logf("floor round %d fresh ours=%v: %.0f msg/s", r+1, isOurs, perSecond)
			if err := c.FlushAll(ctx).Err(); err != nil {
				return fl, err
			}
		}
	}

	// Duplicates: keys the store completed; the floor GETs them.
	keys, attempts := make([]string, dupKeys), map[string]int{}
	for i := range keys {
		keys[i] = "dup:" + strconv.Itoa(i)
	}
	var mu sync.Mutex
	forEach(floorConns, keys, func(k string) {
		tok := storekit.NewToken()
		res, err := store.Claim(ctx, k, idempotency.ClaimRequest{Token: tok, Lease: floorLease, TTL: floorTTL})
		if err == nil && res.Acquired {
			err = store.Complete(ctx, k, tok, nil, floorTTL)
		}
		mu.Lock()
		defer mu.Unlock()
		attempts[k] = res.Record.Attempts
		if err != nil {
			attempts[k] = -1
		}
	})
	if typ, _ := c.Type(ctx, keys[0]).Result(); typ != "string" {
		return fl, fmt.Errorf("a COMPLETED record is a %s, not a string: GET cannot read it", typ)
	}
	cycle := func(w, i int) string { return keys[(w*(dupKeys/floorConns)+i)%dupKeys] }
	for r := range o.floorRounds {
		for _, isOurs := range roundOrder(r) {
			shape, side := msgShape{first: tmpl("get", "{key}")}, &fl.Duplicate.Floor
			if isOurs {
				shape, side = msgShape{first: ours.duplicate, nilOK: true}, &fl.Duplicate.Ours
			}
			counts, perSecond, cpu, err := runLoad(ctx, c, o.floorDur, shape, cycle)
			if err != nil {
				return fl, fmt.Errorf("duplicate, ours %v: %w", isOurs, err)
			}
			side.add(counts, perSecond, cpu)
			o.logf("floor round %d duplicate ours=%v: %.0f msg/s", r+1, isOurs, perSecond)
		}
	}
	// The replayed duplicate claims acquired nothing.
	for k, a := range attempts {
		rec, err := store.Get(ctx, k)
		if err != nil || a < 0 || rec.State != idempotency.StateCompleted || rec.Attempts != a {
			return fl, fmt.Errorf("duplicate %s: %v with %d attempts after the load, had %d (%v)", k, rec.State, rec.Attempts, a, err)
		}
	}
	for _, p := range []*FloorPair{&fl.Fresh, &fl.Duplicate} {
		var ratios []float64
		for i := range p.Ours.Rates {
			ratios = append(ratios, div(p.Ours.Rates[i], p.Floor.Rates[i]))
		}
		p.RateRatio = median(ratios)
		p.Floor.finish()
		p.Ours.finish()
	}
	return fl, nil
}

// roundOrder says which side runs first in round r, ours or the floor,
// alternating: a drift of the machine's speed favours neither.
func roundOrder(r int) []bool {
	if r%2 == 1 {
		return []bool{true, false}
	}
	return []bool{false, true}
}

// checkCompleted checks that key ended COMPLETED: ours by the store's Get,
// the floor's as "done".
func checkCompleted(ctx context.Context, c *redis.Client, s *redisstore.Store, ours bool, key string) error {
	if ours {
		if rec, err := s.Get(ctx, key); err != nil || rec.State != idempotency.StateCompleted {
			return fmt.Errorf("ours, fresh: %s ended %v (%v), not COMPLETED", key, rec.State, err)
		}
		return nil
	}
	if v, err := c.Get(ctx, key).Result(); err != nil || v != "done" {
		return fmt.Errorf("floor, fresh: %s ended %q (%v), not done", key, v, err)
	}
	return nil
}

func (s *FloorSide) add(counts []int, perSecond, cpuUsec float64) {
	for _, n := range counts {
		s.messages += int64(n)
	}
	s.Rates = append(s.Rates, perSecond)
	s.cpuUsec += cpuUsec
}

func (s *FloorSide) finish() {
	s.PerSecond = median(s.Rates)
	s.RedisCPU = div(s.cpuUsec, float64(s.messages))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if m := len(s) / 2; len(s)%2 == 0 {
		return (s[m-1] + s[m]) / 2
	}
	return s[len(s)/2]
}
