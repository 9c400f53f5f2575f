package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Target is one performance target with what this run measured for it.
type Target struct {
	ID       string `json:"id"` // never changes for a target
	Figure   string `json:"figure"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Result is "met", "missed" or "not measured" (its section, broker or
	// concurrency was left out). Value is compared with Bound by Compare
	// ("<", "<=", ">=", or "==" within 0.005).
	Result  string  `json:"result"`
	Value   float64 `json:"value"`
	Compare string  `json:"compare"`
	Bound   float64 `json:"bound"`
}

// The bounds of the targets.
const (
	floorFreshMin  = 0.5 // our fresh message's commands ÷ SET NX, SET XX, rate
	floorDupMin    = 0.5 // our duplicate's commands ÷ GET, rate
	e2eFloorMin    = 0.8 // ours ÷ the floor dedup, end to end
	e2eCPUMaxExtra = 25  // µs of this process's CPU per fresh message beyond the floor dedup's
	keyMaxBytes    = 150 // MEMORY USAGE of a COMPLETED key without output
	e2eConc        = 64  // the concurrency of the end-to-end targets
)

var brokerTitles = []struct{ name, title string }{{"gochannel", "gochannel"}, {"kafka", "Kafka (kfake)"},
	{"redis", "Redis Streams"}, {"amqp", "RabbitMQ"}, {"nats", "NATS"}}

// check fills t's Value, Compare, Bound, Measured and Result.
func (t Target) check(value float64, compare string, bound float64, measured string) Target {
	t.Value, t.Compare, t.Bound, t.Measured = value, compare, bound, measured
	met := map[string]bool{"<": value < bound, "<=": value <= bound, ">=": value >= bound, "==": math.Abs(value-bound) < 0.005}[compare]
	t.Result = map[bool]string{true: "met", false: "missed"}[met]
	return t
}

func (t Target) notMeasured(why string) Target {
	t.Result, t.Measured = "not measured", why
	return t
}

// targets returns every target, in the order of the table.
func (r *report) targets() []Target {
	var ts []Target
	for _, x := range []struct {
		id, figure string
		pair       func(*Floor) FloorPair
		bound      float64
	}{
		{"fresh_commands_vs_floor", "fresh message, store commands alone: rate, ours ÷ floor (SET NX PX, SET XX PX)", func(f *Floor) FloorPair { return f.Fresh }, floorFreshMin},
		{"dup_commands_vs_get", "duplicate, store commands alone: rate, ours ÷ GET", func(f *Floor) FloorPair { return f.Duplicate }, floorDupMin},
	} {
		t := Target{ID: x.id, Figure: x.figure, Target: fmt.Sprintf("≥ %.2f", x.bound)}
		if r.Floor == nil {
			ts = append(ts, t.notMeasured("needs section floor"))
			continue
		}
		p := x.pair(r.Floor)
		ts = append(ts, t.check(p.RateRatio, ">=", x.bound, fmt.Sprintf("%s (Redis CPU %.2f vs %.2f µs per message)", against(p.RateRatio, x.bound), p.Ours.RedisCPU, p.Floor.RedisCPU)))
	}
	for _, b := range brokerTitles {
		t := Target{ID: "e2e_c64_fresh_vs_floor_" + b.name, Figure: fmt.Sprintf("end to end at c=%d, fresh, %s: ours ÷ floor dedup", e2eConc, b.title),
			Target: fmt.Sprintf("≥ %.2f", e2eFloorMin)}
		idem, floor := r.cell(b.name, "idem"), r.cell(b.name, "floor")
		if idem.PerSecond == 0 || floor.PerSecond == 0 {
			ts = append(ts, t.notMeasured(fmt.Sprintf("needs section e2e (broker %s, c=%d)", b.name, e2eConc)))
			continue
		}
		x := idem.PerSecond / floor.PerSecond
		ts = append(ts, t.check(x, ">=", e2eFloorMin, fmt.Sprintf("%s (%s vs %s msg/s)", against(x, e2eFloorMin), rate(idem.PerSecond), rate(floor.PerSecond))))
	}
	t := Target{ID: "e2e_c64_fresh_cpu_gochannel", Figure: fmt.Sprintf("end to end at c=%d, fresh, gochannel: this process's CPU per message, ours − floor dedup", e2eConc),
		Target: fmt.Sprintf("≤ %d µs", e2eCPUMaxExtra)}
	if idem, floor := r.cell("gochannel", "idem"), r.cell("gochannel", "floor"); idem.ClientCPU == 0 || floor.ClientCPU == 0 {
		ts = append(ts, t.notMeasured(fmt.Sprintf("needs section e2e (broker gochannel, c=%d)", e2eConc)))
	} else {
		x := idem.ClientCPU - floor.ClientCPU
		ts = append(ts, t.check(x, "<=", e2eCPUMaxExtra, fmt.Sprintf("%.1f (%.1f vs %.1f µs)", x, idem.ClientCPU, floor.ClientCPU)))
	}
	for _, x := range []struct {
		load, figure string
		want         float64
	}{{"fresh", "fresh message: Redis commands", 2}, {"duplicate-nocache", "duplicate, cache off: Redis commands", 1},
		{"duplicate-warm", "duplicate, warm cache: Redis commands", 0}} {
		t := Target{ID: strings.ReplaceAll(x.load, "-", "_") + "_redis_commands", Figure: x.figure + " (every c)", Target: fmt.Sprintf("%.0f", x.want)}
		worst, cells := x.want, 0
		for _, c := range r.statsCost() {
			if c.Load == x.load {
				if cells++; math.Abs(c.Commands-x.want) > math.Abs(worst-x.want) {
					worst = c.Commands
				}
			}
		}
		if cells == 0 {
			ts = append(ts, t.notMeasured("needs section stats"))
			continue
		}
		ts = append(ts, t.check(worst, "==", x.want, fmt.Sprintf("%.2f", worst)))
	}
	t = Target{ID: "completed_key_bytes", Figure: "Redis memory per COMPLETED key without output (MEMORY USAGE)", Target: fmt.Sprintf("< %d B", keyMaxBytes)}
	if r.Stats == nil {
		ts = append(ts, t.notMeasured("needs section stats"))
	} else {
		ts = append(ts, t.check(r.Stats.MemoryUsage, "<", keyMaxBytes, fmt.Sprintf("%.0f B (%d-byte key)", r.Stats.MemoryUsage, r.Stats.KeyBytes)))
	}
	for i, x := range []struct {
		id, figure string
		want       float64
	}{{"pg_fresh_statements", "pgstore fresh message: statements", 2}, {"pg_duplicate_statements", "pgstore duplicate, cache off: statements", 1},
		{"pg_fresh_tx_statements", "pgstore fresh, completion in the handler's transaction: statements outside it", 1}} {
		t := Target{ID: x.id, Figure: x.figure, Target: fmt.Sprintf("%.0f", x.want)}
		if r.Stats == nil || r.Stats.PG == nil {
			ts = append(ts, t.notMeasured("needs section stats and -pg"))
			continue
		}
		v := []float64{r.Stats.PG.Fresh, r.Stats.PG.Duplicate, r.Stats.PG.FreshTx}[i]
		ts = append(ts, t.check(v, "==", x.want, fmt.Sprintf("%.2f", v)))
	}
	return ts
}

// against formats ratio x with two decimals, or three where two would
// show it equal to bound: 0.796 against 0.8 reads as missed.
func against(x, bound float64) string {
	if s := fmt.Sprintf("%.2f", x); s != fmt.Sprintf("%.2f", bound) || x == bound {
		return s
	}
	return fmt.Sprintf("%.3f", x)
}

// cell is the e2e cell of broker and dedup at e2eConc, zero if not run.
func (r *report) cell(broker, dedup string) Rate {
	for _, x := range r.E2E {
		if x.Broker == broker && x.Dedup == dedup && x.Concurrency == e2eConc {
			return x
		}
	}
	return Rate{}
}

func (r *report) statsCost() []Cost {
	if r.Stats == nil {
		return nil
	}
	return r.Stats.Cost
}

// print prints the tables of the sections that ran, then the targets.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "idembench %s  %s\n", r.Started, r.Machine)
	table := func(title string, rows ...[]any) {
		fmt.Fprintf(w, "\n## %s\n\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, row := range rows {
			for _, cell := range row {
				fmt.Fprintf(tw, "%v\t", cell)
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
	if f := r.Floor; f != nil {
		rows := [][]any{{"load", "side", "msg/s (median)", "rounds (msg/s)", "Redis CPU µs/msg", "ours ÷ floor"}}
		for _, p := range []struct {
			load, floor string
			pair        FloorPair
		}{{"fresh", "SET NX, SET XX", f.Fresh}, {"duplicate", "GET", f.Duplicate}} {
			for i, s := range []FloorSide{p.pair.Floor, p.pair.Ours} {
				rounds := make([]string, len(s.Rates))
				for j, v := range s.Rates {
					rounds[j] = rate(v)
				}
				row := []any{p.load, p.floor, rate(s.PerSecond), strings.Join(rounds, " "), fmt.Sprintf("%.2f", s.RedisCPU), ""}
				if i == 1 {
					row[1], row[5] = "ours", fmt.Sprintf("%.2f", p.pair.RateRatio)
				}
				rows = append(rows, row)
			}
		}
		table(fmt.Sprintf("Command floor (private redis-server; %d connections, pipelines of %d)", floorConns, floorPipeline), rows...)
		fmt.Fprintf(w, "ours, claim:     %s\nours, complete:  %s\nours, duplicate: %s\n",
			strings.Join(f.OursClaim, " ; "), strings.Join(f.OursComplete, " ; "), strings.Join(f.OursDuplicate, " ; "))
	}
	if s := r.Stats; s != nil {
		rows := [][]any{{"load", "c", "commands", "round trips"}}
		for _, x := range s.Cost {
			rows = append(rows, []any{x.Load, x.Concurrency, fmt.Sprintf("%.2f", x.Commands), fmt.Sprintf("%.2f", x.RoundTrips)})
		}
		table(fmt.Sprintf("Redis commands per message (private redis-server, go-redis hook, %d messages per cell)", s.Messages), rows...)
		fmt.Fprintf(w, "memory per COMPLETED key without output (%d-byte key): %.0f B (MEMORY USAGE)\n", s.KeyBytes, s.MemoryUsage)
		if p := s.PG; p != nil {
			fmt.Fprintf(w, "pgstore statements per message (cache off): fresh %.2f, duplicate %.2f, fresh completed in the handler's transaction %.2f outside it\n",
				p.Fresh, p.Duplicate, p.FreshTx)
		}
	}
	if len(r.E2E) > 0 {
		rows := [][]any{{"broker", "c", "none", "idem", "floor", "idem ÷ floor", "CPU µs/msg here + Redis: none", "idem", "floor", "idem − floor", "notes"}}
		for i := 0; i+2 < len(r.E2E); i += 3 { // none, idem, floor of one broker and c
			none, idem, floor := r.E2E[i], r.E2E[i+1], r.E2E[i+2]
			cpu := func(x Rate) string { return fmt.Sprintf("%.1f + %.1f", x.ClientCPU, x.RedisCPU) }
			var notes []string
			for _, x := range r.E2E[i : i+3] {
				if x.Note != "" {
					notes = append(notes, x.Dedup+": "+x.Note)
				}
			}
			rows = append(rows, []any{none.Broker, none.Concurrency, rate(none.PerSecond), rate(idem.PerSecond), rate(floor.PerSecond),
				fmt.Sprintf("%.2f", div(idem.PerSecond, floor.PerSecond)), cpu(none), cpu(idem), cpu(floor),
				cpu(Rate{ClientCPU: idem.ClientCPU - floor.ClientCPU, RedisCPU: idem.RedisCPU - floor.RedisCPU}), strings.Join(notes, "; ")})
		}
		table("End to end through a Watermill router (fresh messages/s, first to last handled; floor = floor dedup)", rows...)
	}
	count := map[string]int{}
	for _, t := range r.Targets {
		count[t.Result]++
	}
	fmt.Fprintf(w, "\n## Targets (%d met, %d missed, %d not measured)\n\n", count["met"], count["missed"], count["not measured"])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\ttarget\tmeasured\tresult")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Figure, t.Target, t.Measured, t.Result)
	}
	tw.Flush()
}
