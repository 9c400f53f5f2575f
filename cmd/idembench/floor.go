package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// Floor compares, on one Redis, the commands our store sends per message
// with the least a Redis deduplication can send: SET NX PX before the
// handler and SET XX PX after it for a fresh message, one GET for a
// duplicate.
type Floor struct {
	Server string `json:"server"`
	// Clients connections, each sending pipelines of Pipeline commands.
	Clients  int `json:"clients"`
	Pipeline int `json:"pipeline"`
	// Rounds of Seconds per load and side, alternating.
	Rounds  int     `json:"rounds"`
	Seconds float64 `json:"seconds"`
	// OursClaim, OursComplete and OursDuplicate are the commands the store
	// sent for a fresh message's Claim and Complete and for the Claim of a
	// COMPLETED key, as captured and replayed (the key shown as <key>, long
	// arguments cut).
	OursClaim     []string `json:"ours_claim"`
	OursComplete  []string `json:"ours_complete"`
	OursDuplicate []string `json:"ours_duplicate"`
	// Fresh and Duplicate put ours beside the floor.
	Fresh     FloorPair `json:"fresh"`
	Duplicate FloorPair `json:"duplicate"`
	Note      string    `json:"note,omitempty"`
}

// FloorPair is one load, ours beside the floor.
type FloorPair struct {
	Floor FloorLoad `json:"floor"`
	Ours  FloorLoad `json:"ours"`
	// RateRatio is the median over the rounds of ours' rate over the
	// floor's rate of the same round: below 1 is slower.
	RateRatio float64 `json:"rate_ratio"`
	// UsecRatio is Ours.RedisUsec over Floor.RedisUsec: the Redis time of
	// ours per message in floors.
	UsecRatio float64 `json:"usec_ratio"`
}

// FloorLoad is one side of a FloorPair.
type FloorLoad struct {
	// Commands are the commands of one message, in order, e.g. "SET, SET".
	Commands           string  `json:"commands"`
	CommandsPerMessage float64 `json:"commands_per_message"`
	// Messages over all rounds; Rates the messages per second of each
	// round, in run order, and PerSecond their median.
	Messages  int64     `json:"messages"`
	Rates     []float64 `json:"rates"`
	PerSecond float64   `json:"per_second"`
	// RedisUsec is Redis's own time per message by INFO commandstats: the
	// usec of the commands the load sent, over its messages.
	RedisUsec float64 `json:"redis_usec"`
	// RedisCPUUsec is the CPU time of Redis's main thread per message (INFO
	// cpu): commands, and the socket reads and writes around them.
	RedisCPUUsec float64 `json:"redis_cpu_usec"`
	// RedisBusy is the share of the runs' time that Redis's main thread
	// was on a CPU: near 1, Redis is the limit; well below, the client is.
	RedisBusy float64 `json:"redis_busy"`
}

// The load of the floor section: the redis-benchmark -c 64 -P 16 shape.
const (
	floorConns    = ceilingClients
	floorPipeline = ceilingPipeline
	// floorDupKeys is how many COMPLETED keys the duplicates cycle through.
	floorDupKeys = 8192
)

// msgShape is what one message sends: first in one pipeline of its
// connection, then second in the next (a message without second takes one
// pipeline).
type msgShape struct {
	first, second []cmdTemplate
	// nilOK says a nil reply is an answer; else it means the key was not
	// what the load needs (a fresh key already there, a duplicate gone).
	nilOK bool
}

// perPipeline is how many messages start in each pipeline: as many as
// fill it, each pipeline carrying the first commands of as many new
// messages as the second commands of earlier ones.
func (m msgShape) perPipeline(pipeline int) int {
	return max(1, pipeline/(len(m.first)+len(m.second)))
}

func (m msgShape) commands() []cmdTemplate {
	return append(append([]cmdTemplate{}, m.first...), m.second...)
}

// floorKeyPlaceholder stands for the key in the floor's templates.
const floorKeyPlaceholder = "{key}"

// floorShapes are the floor's fresh message (SET NX PX, then SET XX PX)
// and duplicate (GET).
func floorShapes() (fresh, dup msgShape) {
	tmpl := func(args ...any) cmdTemplate {
		t, err := newCmdTemplate(args, floorKeyPlaceholder)
		if err != nil {
			panic(err) // the arguments above are constants
		}
		return t
	}
	fresh = msgShape{
		first:  []cmdTemplate{tmpl("set", floorKeyPlaceholder, "1", "nx", "px", floorLease.Milliseconds())},
		second: []cmdTemplate{tmpl("set", floorKeyPlaceholder, "done", "xx", "px", floorTTL.Milliseconds())},
	}
	dup = msgShape{first: []cmdTemplate{tmpl("get", floorKeyPlaceholder)}}
	return fresh, dup
}

// pairedRatio is the median over rounds of ours[i]/floor[i], rounds where
// either is 0 left out; 0 when none is left.
func pairedRatio(ours, floor []float64) float64 {
	var rs []float64
	for i := range min(len(ours), len(floor)) {
		if ours[i] > 0 && floor[i] > 0 {
			rs = append(rs, ours[i]/floor[i])
		}
	}
	return newSpread(rs).Median
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ Calls, Usec int64 }

// parseCommandStats reads INFO commandstats.
func parseCommandStats(info string) map[string]cmdStat {
	m := map[string]cmdStat{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		m[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return m
}

// parseCPU reads the CPU seconds of Redis's main thread from INFO cpu (of
// the whole process where the server does not tell them apart).
func parseCPU(info string) (seconds float64, ok bool) {
	fields := map[string]float64{}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, found := strings.Cut(strings.TrimSpace(line), ":")
		if x, err := strconv.ParseFloat(v, 64); found && err == nil {
			fields[k] = x
		}
	}
	if u, ok := fields["used_cpu_user_main_thread"]; ok {
		return u + fields["used_cpu_sys_main_thread"], true
	}
	u, uok := fields["used_cpu_user"]
	s, sok := fields["used_cpu_sys"]
	return u + s, uok && sok
}

// topLevelUsec sums the commandstats usec, from before to after, of the
// commands a load sent, sent counting them by name. A name that Redis
// called more often than the load sent it was also called inside a script
// (whose own usec holds that time already) or by another client: only the
// load's share of its usec counts, in proportion to calls. missing names
// what the load sent and commandstats did not count.
func topLevelUsec(before, after map[string]cmdStat, sent map[string]int64) (usec float64, missing []string) {
	for name, n := range sent {
		calls, us := after[name].Calls-before[name].Calls, after[name].Usec-before[name].Usec
		if calls <= 0 {
			missing = append(missing, name)
			continue
		}
		share := 1.0
		if calls > n {
			share = float64(n) / float64(calls)
		}
		usec += float64(us) * share
	}
	return usec, missing
}

// serverUsage is what INFO says of a server's work so far.
type serverUsage struct {
	cmds map[string]cmdStat
	cpu  float64 // seconds
}

func readServerUsage(ctx context.Context, c *redis.Client) (serverUsage, error) {
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return serverUsage{}, err
	}
	cpuInfo, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return serverUsage{}, err
	}
	cpu, _ := parseCPU(cpuInfo)
	return serverUsage{cmds: parseCommandStats(stats), cpu: cpu}, nil
}

// floorRun is one load run for a while.
type floorRun struct {
	messages int64
	secs     float64
	usec     float64 // commandstats usec of the commands sent
	cpuUsec  float64 // Redis main thread
	missing  []string
	// counts holds the messages of each connection: connection w used the
	// keys key(w, 0) to key(w, counts[w]-1).
	counts []int
}

// runLoad sends messages of shape on floorConns connections for d, each
// connection pipelining floorPipeline commands, message i of connection w
// on key(w, i). A fresh message's second commands go in the pipeline after
// its first's, on the same connection; when d has passed, each connection
// sends the second commands still due, and stops. Every connection sends
// one pipeline of messages however short d is, so that a run always
// measures each of them.
func runLoad(ctx context.Context, c *redis.Client, d time.Duration, shape msgShape, key func(w, i int) string) (floorRun, error) {
	before, err := readServerUsage(ctx, c)
	if err != nil {
		return floorRun{}, err
	}
	run := floorRun{counts: make([]int, floorConns)}
	per := shape.perPipeline(floorPipeline)
	errs := make(chan error, floorConns)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range floorConns {
		wg.Go(func() {
			conn := c.Conn()
			defer conn.Close()
			var due []string // keys whose second commands are due
			next := 0
			for {
				stopping := next > 0 && time.Now().After(deadline)
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
				if !stopping {
					for range per {
						k := key(w, next)
						next++
						started = append(started, k)
						for _, t := range shape.first {
							p.Do(ctx, t.with(k)...)
						}
					}
				}
				cmds, _ := p.Exec(ctx)
				if err := checkReplies(cmds, shape.nilOK); err != nil {
					errs <- err
					return
				}
				if len(shape.second) > 0 {
					run.counts[w] += len(due)
					due = started
				} else {
					run.counts[w] += len(started)
				}
			}
		})
	}
	wg.Wait()
	run.secs = time.Since(start).Seconds()
	close(errs)
	if err := <-errs; err != nil {
		return run, err
	}
	after, err := readServerUsage(ctx, c)
	if err != nil {
		return run, err
	}
	for _, n := range run.counts {
		run.messages += int64(n)
	}
	sent := map[string]int64{}
	for _, t := range shape.commands() {
		sent[t.name()] += run.messages
	}
	run.usec, run.missing = topLevelUsec(before.cmds, after.cmds, sent)
	run.cpuUsec = 1e6 * (after.cpu - before.cpu)
	return run, nil
}

// checkReplies returns the first error reply of cmds, or a nil reply
// unless nilOK.
func checkReplies(cmds []redis.Cmder, nilOK bool) error {
	for _, cmd := range cmds {
		switch err := cmd.Err(); {
		case errors.Is(err, redis.Nil):
			if !nilOK {
				return fmt.Errorf("nil reply to %v: the key was not what the load needs", cmd.Args())
			}
		case err != nil:
			return fmt.Errorf("%s: %w", cmd.Name(), err)
		}
	}
	return nil
}

// floorBench runs the floor section on one server.
type floorBench struct {
	o      options
	c      *redis.Client
	store  *redisstore.Store // unpipelined, on c: setup and checks
	prefix string
}

// freshKey names message i of connection w in round r of one side.
func (b *floorBench) freshKey(r int, side string) func(w, i int) string {
	p := b.prefix + "r" + strconv.Itoa(r) + side + ":"
	return func(w, i int) string { return p + strconv.Itoa(w) + ":" + strconv.Itoa(i) }
}

// cycle spreads the connections over keys: connection w starts at its own
// offset and goes round.
func cycle(keys []string) func(w, i int) string {
	stride := max(1, len(keys)/floorConns)
	return func(w, i int) string { return keys[(w*stride+i)%len(keys)] }
}

// checkFresh checks that the first and last key of each connection ended
// COMPLETED: ours by the store's Get, the floor's by GET.
func (b *floorBench) checkFresh(ctx context.Context, ours bool, run floorRun, key func(w, i int) string) error {
	for w, n := range run.counts {
		for _, i := range []int{0, n - 1} {
			if n == 0 {
				continue
			}
			k := key(w, i)
			if ours {
				rec, err := b.store.Get(ctx, k)
				if err != nil {
					return err
				}
				if rec.State != idempotency.StateCompleted {
					return fmt.Errorf("ours, fresh: %s ended %v, not COMPLETED: the replayed commands did not claim and complete it", k, rec.State)
				}
				continue
			}
			if v, err := b.c.Get(ctx, k).Result(); err != nil || v != "done" {
				return fmt.Errorf("floor, fresh: %s ended %q (%v), not done", k, v, err)
			}
		}
	}
	return nil
}

// unlinkRun deletes the keys a fresh run used.
func (b *floorBench) unlinkRun(ctx context.Context, run floorRun, key func(w, i int) string) {
	const batch = 1000
	var keys []string
	flush := func() {
		if len(keys) > 0 {
			if err := b.c.Unlink(ctx, keys...).Err(); err != nil {
				log.Printf("floor: clean up: %v", err)
			}
			keys = keys[:0]
		}
	}
	for w, n := range run.counts {
		for i := range n {
			if keys = append(keys, key(w, i)); len(keys) == batch {
				flush()
			}
		}
	}
	flush()
}

// completeKeys has the store claim and complete each key, as a fresh
// message would, and returns each record's attempts.
func (b *floorBench) completeKeys(ctx context.Context, keys []string) (map[string]int, error) {
	var mu sync.Mutex
	var firstErr error
	attempts := make(map[string]int, len(keys))
	forEach(floorConns, keys, func(k string) {
		tok := idempotency.NewToken()
		res, err := b.store.Claim(ctx, k, idempotency.ClaimRequest{Token: tok, Lease: floorLease, TTL: floorTTL})
		if err == nil && !res.Acquired {
			err = fmt.Errorf("claim of %s not acquired", k)
		}
		if err == nil {
			err = b.store.Complete(ctx, k, tok, nil, floorTTL)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		attempts[k] = res.Record.Attempts
	})
	return attempts, firstErr
}

// checkDuplicates checks that every key is still COMPLETED with the
// attempts it had: the replayed duplicate claims acquired nothing.
func (b *floorBench) checkDuplicates(ctx context.Context, attempts map[string]int) error {
	for k, a := range attempts {
		rec, err := b.store.Get(ctx, k)
		if err != nil {
			return err
		}
		if rec.State != idempotency.StateCompleted || rec.Attempts != a {
			return fmt.Errorf("ours, duplicate: %s is %v with %d attempts after the load, was COMPLETED with %d: the replayed claim acquired it",
				k, rec.State, rec.Attempts, a)
		}
	}
	return nil
}

// floorSide is one side of a load: its shape, its keys and what it adds
// up to.
type floorSide struct {
	shape msgShape
	ours  bool
	load  *FloorLoad
	usec  float64
	cpu   float64
	secs  float64
}

func (s *floorSide) add(run floorRun) {
	s.load.Messages += run.messages
	s.load.Rates = append(s.load.Rates, float64(run.messages)/run.secs)
	s.usec += run.usec
	s.cpu += run.cpuUsec
	s.secs += run.secs
}

func (s *floorSide) finish() {
	s.load.Commands = commandNames(s.shape.first, s.shape.second)
	s.load.CommandsPerMessage = float64(len(s.shape.first) + len(s.shape.second))
	s.load.PerSecond = newSpread(s.load.Rates).Median
	if s.load.Messages > 0 {
		s.load.RedisUsec = s.usec / float64(s.load.Messages)
		s.load.RedisCPUUsec = s.cpu / float64(s.load.Messages)
	}
	if s.secs > 0 {
		s.load.RedisBusy = s.cpu / 1e6 / s.secs
	}
}

func (p *FloorPair) finish() {
	p.RateRatio = pairedRatio(p.Ours.Rates, p.Floor.Rates)
	p.UsecRatio = div(p.Ours.RedisUsec, p.Floor.RedisUsec)
}

func runFloor(o options) Floor {
	fl, err := measureFloor(context.Background(), o)
	if err != nil {
		log.Fatalf("floor: %v", err)
	}
	return fl
}

// measureFloor runs the floor section: on a private redis-server when one
// can be started, else on the shared one.
func measureFloor(ctx context.Context, o options) (Floor, error) {
	fl := Floor{Server: "private redis-server", Clients: floorConns, Pipeline: floorPipeline, Rounds: o.floorRounds, Seconds: o.floorDur.Seconds()}
	var notes []string
	addr, stop, err := startRedis()
	if err != nil {
		addr, stop = o.redisAddr, func() {}
		fl.Server = "shared " + o.redisAddr
		notes = append(notes, "no private redis-server ("+err.Error()+"): commandstats and CPU include other clients")
	}
	defer stop()
	b := &floorBench{o: o, prefix: o.prefix + ":floor:"}
	b.c = redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, PoolSize: floorConns + 8})
	defer b.c.Close()
	defer cleanup(b.c, b.prefix)
	b.store = newRedisStore(b.c, true)

	ours, err := captureStore(ctx, addr, b.prefix+"capture:")
	if err != nil {
		return fl, err
	}
	fl.OursClaim, fl.OursComplete, fl.OursDuplicate = templatesString(ours.claim), templatesString(ours.complete), templatesString(ours.duplicate)
	warmPool(b.c, floorConns)

	// Duplicates: keys the store completed. The floor GETs the same keys
	// when they hold a string; else keys of its own that hold "done".
	dupKeys := make([]string, floorDupKeys)
	for i := range dupKeys {
		dupKeys[i] = b.prefix + "dup:" + strconv.Itoa(i)
	}
	attempts, err := b.completeKeys(ctx, dupKeys)
	if err != nil {
		return fl, fmt.Errorf("completing the duplicates' keys: %w", err)
	}
	getKeys := dupKeys
	if typ, _ := b.c.Type(ctx, dupKeys[0]).Result(); typ != "string" {
		getKeys = make([]string, len(dupKeys))
		p := b.c.Pipeline()
		for i := range getKeys {
			getKeys[i] = b.prefix + "dupf:" + strconv.Itoa(i)
			p.Set(ctx, getKeys[i], "done", floorTTL)
		}
		if _, err := p.Exec(ctx); err != nil {
			return fl, err
		}
		notes = append(notes, fmt.Sprintf("a COMPLETED record is a %s: GET reads keys holding \"done\" instead", typ))
	}

	floorFresh, floorDup := floorShapes()
	fresh := [2]*floorSide{
		{shape: floorFresh, load: &fl.Fresh.Floor},
		{shape: msgShape{first: ours.claim, second: ours.complete, nilOK: true}, ours: true, load: &fl.Fresh.Ours},
	}
	dup := [2]*floorSide{
		{shape: floorDup, load: &fl.Duplicate.Floor},
		{shape: msgShape{first: ours.duplicate, nilOK: true}, ours: true, load: &fl.Duplicate.Ours},
	}
	missing := map[string]bool{}
	for r := range o.floorRounds {
		// Floor then ours, then ours then floor: a drift of the machine's
		// speed favours neither.
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			side := fresh[i]
			key := b.freshKey(r, map[bool]string{false: "f", true: "o"}[side.ours])
			run, err := runLoad(ctx, b.c, o.floorDur, side.shape, key)
			if err != nil {
				return fl, fmt.Errorf("fresh, ours %v: %w", side.ours, err)
			}
			if err := b.checkFresh(ctx, side.ours, run, key); err != nil {
				return fl, err
			}
			b.unlinkRun(ctx, run, key)
			side.add(run)
			for _, m := range run.missing {
				missing[m] = true
			}
			o.logf("floor round %d fresh ours=%v: %d messages in %.2fs, %.2f µs/msg commandstats", r+1, side.ours, run.messages, run.secs, run.usec/float64(max(1, run.messages)))
		}
		for _, i := range order {
			side := dup[i]
			keys := getKeys
			if side.ours {
				keys = dupKeys
			}
			run, err := runLoad(ctx, b.c, o.floorDur, side.shape, cycle(keys))
			if err != nil {
				return fl, fmt.Errorf("duplicate, ours %v: %w", side.ours, err)
			}
			side.add(run)
			for _, m := range run.missing {
				missing[m] = true
			}
			o.logf("floor round %d duplicate ours=%v: %d messages in %.2fs, %.2f µs/msg commandstats", r+1, side.ours, run.messages, run.secs, run.usec/float64(max(1, run.messages)))
		}
	}
	if err := b.checkDuplicates(ctx, attempts); err != nil {
		return fl, err
	}
	for _, s := range append(fresh[:], dup[:]...) {
		s.finish()
	}
	fl.Fresh.finish()
	fl.Duplicate.finish()
	for m := range missing {
		notes = append(notes, "commandstats did not count "+m)
	}
	fl.Note = strings.Join(notes, "; ")
	return fl, nil
}
