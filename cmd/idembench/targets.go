package main

import (
	"fmt"
	"math"
	"strings"
)

// Target is one performance target with what this run measured for it.
type Target struct {
	// ID names the target for programs; it never changes for a target.
	ID string `json:"id"`
	// Figure, Target and Measured are the table's text.
	Figure   string `json:"figure"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Result is "met", "missed" or "not measured" (its section was not run,
	// or its concurrency or broker was left out).
	Result string `json:"result"`
	// Value is the number compared with Bound by Compare ("<", "<=",
	// ">=", or "==" within 0.005): a ratio, a count per message, bytes, or µs. 0
	// when not measured.
	Value   float64 `json:"value"`
	Compare string  `json:"compare"`
	Bound   float64 `json:"bound"`
}

// The results of a Target.
const (
	resultMet         = "met"
	resultMissed      = "missed"
	resultNotMeasured = "not measured"
)

// Bounds of the targets.
const (
	dupVsWatermillMaxTime = 1.2 // our time per duplicate / the Deduplicator's
	pipelinedCeilingMin   = 0.8 // our fresh rate / the -P 16 message ceiling
	ceilingMin            = 0.7 // our fresh rate / the -P 1 message ceiling
	e2eMin                = 0.8 // dedup / none, end to end
	completedKeyMaxBytes  = 150 // MEMORY USAGE of a COMPLETED key without output
	floorFreshMin         = 0.5 // our fresh message's commands / the floor's (SET NX, SET XX), rate
	floorDupMin           = 0.5 // our duplicate's commands / GET, rate
	e2eFloorMin           = 0.8 // ours / the floor dedup, end to end
)

// e2eFloorBrokers are the brokers whose end-to-end ratio to the floor is a
// target: all of them, as the floor sends Redis commands on every one.
var e2eFloorBrokers = []struct{ name, title string }{{"gochannel", "gochannel"}, {"kafka", "Kafka (kfake)"},
	{"redis", "Redis Streams"}, {"amqp", "RabbitMQ"}, {"nats", "NATS"}}

// e2eTargetBrokers are the brokers whose end-to-end ratio is a target.
var e2eTargetBrokers = []struct{ name, title string }{{"redis", "Redis Streams"}, {"amqp", "RabbitMQ"}, {"nats", "NATS"}}

// check fills t's Value, Compare, Bound and Result.
func (t Target) check(value float64, compare string, bound float64) Target {
	t.Value, t.Compare, t.Bound = value, compare, bound
	met := false
	switch compare {
	case "<":
		met = value < bound
	case "<=":
		met = value <= bound
	case ">=":
		met = value >= bound
	case "==":
		met = math.Abs(value-bound) < 0.005
	}
	t.Result = metWord(met)
	return t
}

func notMeasured(t Target, why string) Target {
	t.Result, t.Measured = resultNotMeasured, why
	return t
}

// targets returns every target, in the order of the table: those of the
// command floor first, then those of auto-pipelining and the local cache,
// then the earlier ones that must still hold.
func (r *report) targets() []Target {
	var ts []Target
	ts = append(ts, r.floorTargets()...)
	for _, b := range e2eFloorBrokers {
		ts = append(ts, r.e2eFloorTarget(b.name, b.title))
	}
	ts = append(ts, r.dupWarmCommandsTarget())
	for _, c := range []int{1, ceilingClients} {
		ts = append(ts, r.chainTimeTarget(fmt.Sprintf("dup_warm_chain_vs_watermill_c%d", c),
			fmt.Sprintf("duplicates, warm cache, c=%d: chain time, redisstore ÷ Watermill Deduplicator", c),
			"redisstore", "duplicate", c, dupVsWatermillMaxTime))
	}
	ts = append(ts, r.ceilingTarget("fresh_c64_vs_pipelined_ceiling", fmt.Sprintf("fresh messages at c=%d: rate ÷ redis-benchmark -P %d message ceiling", ceilingClients, ceilingPipeline),
		true, pipelinedCeilingMin))
	ts = append(ts, r.latencyTarget())
	for _, load := range []string{"fresh", "duplicate"} {
		for _, b := range e2eTargetBrokers {
			ts = append(ts, r.e2eTarget(b.name, b.title, load))
		}
	}
	ts = append(ts, r.costTarget("fresh_redis_commands", "fresh message: Redis commands (every cost cell)", loadFresh, 2))
	ts = append(ts, r.costTarget("dup_nocache_redis_commands", "duplicate, cache off: Redis commands (every cost cell)", loadDupNoCache, 1))
	ts = append(ts, r.renewalTarget())
	ts = append(ts, r.memoryTarget())
	ts = append(ts, r.ceilingTarget("fresh_c64_vs_ceiling", fmt.Sprintf("fresh messages at c=%d: rate ÷ redis-benchmark -P 1 message ceiling", ceilingClients),
		false, ceilingMin))
	ts = append(ts, r.pgTargets()...)
	ts = append(ts, r.mysqlTargets()...)
	return ts
}

// dupWarmCommandsTarget: a duplicate that the local cache holds costs no
// Redis command, by Redis's count and the client's, in every cell.
func (r *report) dupWarmCommandsTarget() Target {
	t := Target{ID: "dup_warm_redis_commands", Figure: "duplicates, warm cache: Redis commands per duplicate", Target: "0"}
	if r.Stats == nil {
		return notMeasured(t, "needs section stats")
	}
	worst, cells := 0.0, 0
	for _, x := range r.Stats.Cost {
		if x.Load == loadDupWarm {
			worst, cells = max(worst, x.ServerCommands, x.ClientCommands), cells+1
		}
	}
	if cells == 0 {
		return notMeasured(t, "no cell measured")
	}
	t.Measured = fmt.Sprintf("%.2f at most (Redis commandstats and client hook; %d cells: c=%s, auto-pipelining off and on)", worst, cells, joinInts(r.Config.Concurrency))
	return t.check(worst, "<=", 0)
}

// chainTimeTarget compares the time per message of ours (dedup) with
// Watermill's Deduplicator's in the chain section: the ratio of the
// Deduplicator's rate to ours.
func (r *report) chainTimeTarget(id, figure, dedup, load string, c int, bound float64) Target {
	t := Target{ID: id, Figure: figure, Target: fmt.Sprintf("≤ %.1f×", bound)}
	ours, wm := r.find(r.Chain, "", dedup, load, c), r.find(r.Chain, "", "watermill", load, c)
	if ours == 0 || wm == 0 {
		return notMeasured(t, fmt.Sprintf("needs section chain (c=%d)", c))
	}
	x := wm / ours
	t.Measured = fmt.Sprintf("%s× (%s µs vs %s µs per message)", against(x, bound), micros(ours), micros(wm))
	return t.check(x, "<=", bound)
}

// ceilingTarget compares our fresh rate at the ceiling's concurrency (chain
// section) with a redis-benchmark message ceiling of the same run.
func (r *report) ceilingTarget(id, figure string, pipelined bool, bound float64) Target {
	t := Target{ID: id, Figure: figure, Target: fmt.Sprintf("≥ %.2f", bound)}
	ours := r.find(r.Chain, "", "redisstore", "fresh", ceilingClients)
	var ceiling float64
	if r.Ceiling != nil {
		ceiling = r.Ceiling.MessageCeiling
		if pipelined {
			ceiling = r.Ceiling.MessageCeilingPipelined
		}
	}
	if ours == 0 || ceiling == 0 {
		return notMeasured(t, fmt.Sprintf("needs sections chain (c=%d) and ceiling, and redis-benchmark", ceilingClients))
	}
	x := ours / ceiling
	t.Measured = fmt.Sprintf("%s (%s of %s msg/s)", against(x, bound), rate(ours), rate(ceiling))
	return t.check(x, ">=", bound)
}

func (r *report) latencyTarget() Target {
	t := Target{ID: "fresh_c1_latency", Figure: "fresh messages at c=1: latency, auto-pipelining on vs off",
		Target: "median on ≤ slowest round off"}
	l := r.Latency
	if l == nil || len(l.On.Micros) == 0 || len(l.Off.Micros) == 0 {
		return notMeasured(t, "needs section latency")
	}
	t.Measured = fmt.Sprintf("on %.1f µs [%.1f–%.1f], off %.1f µs [%.1f–%.1f] (median [min–max], %d rounds each)",
		l.On.Median, l.On.Min, l.On.Max, l.Off.Median, l.Off.Min, l.Off.Max, l.Rounds)
	return t.check(l.On.Median, "<=", l.Off.Max)
}

func (r *report) e2eTarget(broker, title, load string) Target {
	c := ceilingClients
	t := Target{ID: fmt.Sprintf("e2e_c%d_%s_%s", c, load, broker),
		Figure: fmt.Sprintf("end to end at c=%d, %s, %s: dedup ÷ none", c, load, title), Target: fmt.Sprintf("≥ %.2f", e2eMin)}
	none, idem := r.find(r.E2E, broker, "none", load, c), r.find(r.E2E, broker, "idem", load, c)
	if none == 0 || idem == 0 {
		return notMeasured(t, fmt.Sprintf("needs section e2e (broker %s, c=%d)", broker, c))
	}
	x := idem / none
	t.Measured = fmt.Sprintf("%s (%s vs %s msg/s)", against(x, e2eMin), rate(idem), rate(none))
	return t.check(x, ">=", e2eMin)
}

// floorTargets compare the rates of our store's commands and of the
// floor's, replayed side by side on one Redis (the floor section).
func (r *report) floorTargets() []Target {
	shape := fmt.Sprintf("%d connections, pipelines of %d", floorConns, floorPipeline)
	ts := []Target{
		{ID: "fresh_commands_vs_floor", Figure: "fresh message, store commands alone (" + shape + "): rate, ours ÷ floor (SET NX PX, SET XX PX)",
			Target: fmt.Sprintf("≥ %.2f", floorFreshMin)},
		{ID: "dup_commands_vs_get", Figure: "duplicate, store commands alone (" + shape + "): rate, ours ÷ GET",
			Target: fmt.Sprintf("≥ %.2f", floorDupMin)},
	}
	f := r.Floor
	for i, x := range []struct {
		pair  *FloorPair
		bound float64
	}{{pairOf(f, true), floorFreshMin}, {pairOf(f, false), floorDupMin}} {
		if x.pair == nil || x.pair.RateRatio == 0 {
			ts[i] = notMeasured(ts[i], "needs section floor")
			continue
		}
		p := x.pair
		ts[i].Measured = fmt.Sprintf("%s (%s vs %s msg/s, medians of %d rounds; Redis %.1f vs %.1f µs per message)", against(p.RateRatio, x.bound),
			rate(p.Ours.PerSecond), rate(p.Floor.PerSecond), len(p.Ours.Rates), p.Ours.RedisUsec, p.Floor.RedisUsec)
		ts[i] = ts[i].check(p.RateRatio, ">=", x.bound)
	}
	return ts
}

// pairOf returns f's fresh or duplicate pair, nil without f.
func pairOf(f *Floor, fresh bool) *FloorPair {
	switch {
	case f == nil:
		return nil
	case fresh:
		return &f.Fresh
	default:
		return &f.Duplicate
	}
}

// e2eFloorTarget compares ours with the floor dedup end to end, fresh
// messages at c=64: the floor's duplicates ask Redis where ours answer from
// the local cache, so only fresh messages compare two stores.
func (r *report) e2eFloorTarget(broker, title string) Target {
	c := ceilingClients
	t := Target{ID: fmt.Sprintf("e2e_c%d_fresh_vs_floor_%s", c, broker),
		Figure: fmt.Sprintf("end to end at c=%d, fresh, %s: ours ÷ floor dedup", c, title), Target: fmt.Sprintf("≥ %.2f", e2eFloorMin)}
	floor, idem := r.find(r.E2E, broker, "floor", "fresh", c), r.find(r.E2E, broker, "idem", "fresh", c)
	if floor == 0 || idem == 0 {
		return notMeasured(t, fmt.Sprintf("needs section e2e (broker %s, c=%d)", broker, c))
	}
	x := idem / floor
	t.Measured = fmt.Sprintf("%s (%s vs %s msg/s)", against(x, e2eFloorMin), rate(idem), rate(floor))
	return t.check(x, ">=", e2eFloorMin)
}

// costTarget: every cost cell of load costs want commands per message, by
// Redis's count and the client's.
func (r *report) costTarget(id, figure, load string, want float64) Target {
	t := Target{ID: id, Figure: figure, Target: fmt.Sprintf("%.0f", want)}
	if r.Stats == nil {
		return notMeasured(t, "needs section stats")
	}
	lo, hi, cells := math.Inf(1), math.Inf(-1), 0
	for _, x := range r.Stats.Cost {
		if x.Load == load {
			lo, hi, cells = min(lo, x.ServerCommands, x.ClientCommands), max(hi, x.ServerCommands, x.ClientCommands), cells+1
		}
	}
	if cells == 0 {
		return notMeasured(t, "no cell measured")
	}
	t.Measured = fmt.Sprintf("%.2f–%.2f (Redis commandstats and client hook, %d cells)", lo, hi, cells)
	worst := lo
	if math.Abs(hi-want) > math.Abs(lo-want) {
		worst = hi
	}
	return t.check(worst, "==", want)
}

func (r *report) renewalTarget() Target {
	t := Target{ID: "renewals", Figure: "handler shorter than lease/3: Redis commands (no renewal)",
		Target: "2"}
	if r.Stats == nil {
		return notMeasured(t, "needs section stats")
	}
	s := r.Stats
	t.Measured = fmt.Sprintf("%.2f (handler %s, lease %s); handler %s: %.2f", s.FastHandler.CommandsPerMessage, s.FastHandler.Handler,
		s.FastHandler.Lease, s.SlowHandler.Handler, s.SlowHandler.CommandsPerMessage)
	return t.check(s.FastHandler.CommandsPerMessage, "==", 2)
}

func (r *report) memoryTarget() Target {
	t := Target{ID: "completed_key_bytes", Figure: "Redis memory per COMPLETED key without output (MEMORY USAGE)",
		Target: fmt.Sprintf("< %d B", completedKeyMaxBytes)}
	if r.Stats == nil || r.Stats.MemoryNoOutput == 0 {
		return notMeasured(t, "needs section stats")
	}
	t.Measured = fmt.Sprintf("%.0f B (%d-byte key)", r.Stats.MemoryNoOutput, r.Stats.KeyBytes)
	return t.check(r.Stats.MemoryNoOutput, "<", completedKeyMaxBytes)
}

func (r *report) pgTargets() []Target {
	ts := []Target{
		{ID: "pg_fresh_statements", Figure: "pgstore fresh message: statements", Target: "2"},
		{ID: "pg_duplicate_statements", Figure: "pgstore duplicate, cache off: statements", Target: "1"},
		{ID: "pg_fresh_tx_statements", Figure: "pgstore fresh, completion in the handler's transaction: statements outside it", Target: "1"},
	}
	p := r.PGStats
	if p == nil {
		for i := range ts {
			ts[i] = notMeasured(ts[i], "needs section stats and -pg")
		}
		return ts
	}
	for i, v := range []float64{p.Fresh, p.Duplicate, p.FreshTx} {
		ts[i].Measured = fmt.Sprintf("%.2f", v)
		ts[i] = ts[i].check(v, "==", []float64{2, 1, 1}[i])
	}
	return ts
}

// mysqlTargets are pgTargets for mysqlstore, whose claim is two statements
// (MySQL cannot return the row it wrote).
func (r *report) mysqlTargets() []Target {
	ts := []Target{
		{ID: "mysql_fresh_statements", Figure: "mysqlstore fresh message: round trips", Target: "3"},
		{ID: "mysql_duplicate_statements", Figure: "mysqlstore duplicate, cache off: round trips", Target: "2"},
		{ID: "mysql_fresh_tx_statements", Figure: "mysqlstore fresh, completion in the handler's transaction: round trips outside it", Target: "2"},
	}
	p := r.MySQLStats
	if p == nil {
		for i := range ts {
			ts[i] = notMeasured(ts[i], "needs section stats and -mysql")
		}
		return ts
	}
	for i, v := range []float64{p.Fresh, p.Duplicate, p.FreshTx} {
		ts[i].Measured = fmt.Sprintf("%.2f", v)
		ts[i] = ts[i].check(v, "==", []float64{3, 2, 2}[i])
	}
	return ts
}

// against formats ratio x with two decimals, or three when two would show
// it equal to bound: 0.796 against 0.8 reads as missed.
func against(x, bound float64) string {
	if s := fmt.Sprintf("%.2f", x); s != fmt.Sprintf("%.2f", bound) || x == bound {
		return s
	}
	return fmt.Sprintf("%.3f", x)
}

// micros formats the time per message of a rate in µs.
func micros(perSecond float64) string {
	us := 1e6 / perSecond
	if us < 10 {
		return fmt.Sprintf("%.2f", us)
	}
	return fmt.Sprintf("%.1f", us)
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
