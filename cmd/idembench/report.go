package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// schemaVersion is the version of the JSON report's layout (see the package
// documentation); it changes when a field is renamed, removed or changes
// meaning, not when one is added.
const schemaVersion = 2

type report struct {
	SchemaVersion int          `json:"schema_version"`
	Machine       Machine      `json:"machine"`
	Started       string       `json:"started"`
	Prefix        string       `json:"prefix"`
	Config        reportConfig `json:"config"`
	Chain         []Rate       `json:"chain,omitempty"`
	Latency       *Latency     `json:"latency,omitempty"`
	Ceiling       *Ceiling     `json:"ceiling,omitempty"`
	Floor         *Floor       `json:"floor,omitempty"`
	Stats         *Stats       `json:"stats,omitempty"`
	PGStats       *PGStats     `json:"pg_stats,omitempty"`
	MySQLStats    *MySQLStats  `json:"mysql_stats,omitempty"`
	E2E           []Rate       `json:"e2e,omitempty"`
	Ratios        []Ratios     `json:"ratios,omitempty"`
	E2ERatios     []E2ERatio   `json:"e2e_ratios,omitempty"`
	Targets       []Target     `json:"targets"`
}

// reportConfig is what the run was asked to do.
type reportConfig struct {
	Sections       []string `json:"sections"`
	N              int      `json:"n"`
	ChainSeconds   float64  `json:"chain_seconds"`
	CeilingSeconds float64  `json:"ceiling_seconds"`
	FloorSeconds   float64  `json:"floor_seconds"`
	FloorRounds    int      `json:"floor_rounds"`
	Rounds         int      `json:"rounds"`
	StatsMessages  int      `json:"stats_messages"`
	Concurrency    []int    `json:"concurrency"`
	Brokers        []string `json:"brokers"`
}

// Ratios compares ours (redisstore and memstore) with the others at one
// concurrency and load, from the chain section of the same run. Every
// ratio is of rates: below 1 is slower. 0 means not measured.
type Ratios struct {
	Load        string `json:"load"`
	Concurrency int    `json:"concurrency"`
	// Ours on memstore / Watermill's Deduplicator.
	MemstoreVsWatermill float64 `json:"memstore_vs_watermill"`
	// Ours on Redis (defaults) / Watermill's Deduplicator.
	RedisVsWatermill float64 `json:"redis_vs_watermill"`
	// Ours on Redis / no deduplication.
	RedisVsNone float64 `json:"redis_vs_none"`
	// Ours on Redis / the naive GET-then-SET reference.
	RedisVsNaive float64 `json:"redis_vs_naive"`
	// Ours on PostgreSQL / ours on Redis (0 without -pg).
	PGVsRedis float64 `json:"pg_vs_redis"`
	// Ours on MySQL / ours on Redis (0 without -mysql).
	MySQLVsRedis float64 `json:"mysql_vs_redis"`
	// Ours on Redis / the Redis message ceiling (script rate/2: a fresh
	// message costs two scripts), without and with pipelining (-P 1,
	// -P 16); fresh messages at the ceiling's concurrency only (duplicates
	// are answered by the local cache, without Redis).
	RedisVsCeiling          float64 `json:"redis_vs_ceiling"`
	RedisVsPipelinedCeiling float64 `json:"redis_vs_pipelined_ceiling"`
}

// E2ERatio compares ours end to end with no deduplication and with the
// floor (floorDedup) at one broker, concurrency and load. Ratios of rates:
// below 1 is slower; 0 where not measured.
type E2ERatio struct {
	Broker      string  `json:"broker"`
	Concurrency int     `json:"concurrency"`
	Load        string  `json:"load"`
	IdemVsNone  float64 `json:"idem_vs_none"`
	IdemVsFloor float64 `json:"idem_vs_floor"`
}

func (r *report) find(rates []Rate, broker, dedup, load string, c int) float64 {
	if x := r.findRate(rates, broker, dedup, load, c); x != nil {
		return x.PerSecond
	}
	return 0
}

// findRate returns the cell of rates for broker, dedup, load and c, or nil.
func (r *report) findRate(rates []Rate, broker, dedup, load string, c int) *Rate {
	for i, x := range rates {
		if x.Broker == broker && x.Dedup == dedup && x.Load == load && x.Concurrency == c {
			return &rates[i]
		}
	}
	return nil
}

func div(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return a / b
}

func (r *report) summarise() {
	for _, c := range r.Config.Concurrency {
		if len(r.Chain) == 0 {
			break
		}
		for _, load := range []string{"fresh", "duplicate"} {
			ours := r.find(r.Chain, "", "redisstore", load, c)
			wm := r.find(r.Chain, "", "watermill", load, c)
			x := Ratios{Load: load, Concurrency: c,
				MemstoreVsWatermill: div(r.find(r.Chain, "", "memstore", load, c), wm),
				RedisVsWatermill:    div(ours, wm),
				RedisVsNone:         div(ours, r.find(r.Chain, "", "none", load, c)),
				RedisVsNaive:        div(ours, r.find(r.Chain, "", "naiveredis", load, c)),
				PGVsRedis:           div(r.find(r.Chain, "", "pgstore", load, c), ours),
				MySQLVsRedis:        div(r.find(r.Chain, "", "mysqlstore", load, c), ours),
			}
			if r.Ceiling != nil && c == r.Ceiling.Clients && load == "fresh" {
				x.RedisVsCeiling = div(ours, r.Ceiling.MessageCeiling)
				x.RedisVsPipelinedCeiling = div(ours, r.Ceiling.MessageCeilingPipelined)
			}
			r.Ratios = append(r.Ratios, x)
		}
	}
	for _, b := range r.Config.Brokers {
		for _, c := range r.Config.Concurrency {
			for _, load := range []string{"fresh", "duplicate"} {
				idem := r.find(r.E2E, b, "idem", load, c)
				if idem == 0 {
					continue
				}
				r.E2ERatios = append(r.E2ERatios, E2ERatio{Broker: b, Concurrency: c, Load: load,
					IdemVsNone: div(idem, r.find(r.E2E, b, "none", load, c)), IdemVsFloor: div(idem, r.find(r.E2E, b, "floor", load, c))})
			}
		}
	}
	r.Targets = r.targets()
}

func (r *report) print(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "idembench %s  %s/%s  %d CPUs (GOMAXPROCS %d)  %s  %s\n", r.Started, m.GOOS, m.GOARCH, m.CPUs, m.GOMAXPROCS, m.GoVersion, m.CPUModel)
	r.printChain(w)
	if r.Latency != nil {
		r.Latency.print(w)
	}
	if r.Ceiling != nil {
		r.Ceiling.print(w, r.find(r.Chain, "", "redisstore", "fresh", r.Ceiling.Clients))
	}
	if r.Floor != nil {
		r.Floor.print(w)
	}
	if r.Stats != nil {
		r.Stats.print(w)
	}
	if r.PGStats != nil {
		r.PGStats.print(w)
	}
	if r.MySQLStats != nil {
		r.MySQLStats.print(w)
	}
	r.printE2E(w)
	r.printTargets(w)
}

// printChain prints the chain section and its ratios, if it ran.
func (r *report) printChain(w io.Writer) {
	if len(r.Chain) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Middleware chain, no broker (messages/s, %.0fs per cell; handler does nothing)\n\n", r.Config.ChainSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "dedup\t"
	for _, c := range r.Config.Concurrency {
		head += fmt.Sprintf("fresh c=%d\tdup c=%d\t", c, c)
	}
	fmt.Fprintln(tw, head+"dup cache hits\t")
	for _, d := range chainDedups {
		if (needsPG[d] || needsMySQL[d]) && r.find(r.Chain, "", d, "fresh", r.Config.Concurrency[0]) == 0 {
			continue
		}
		row := d + "\t"
		var hits, lookups uint64
		for _, c := range r.Config.Concurrency {
			row += rate(r.find(r.Chain, "", d, "fresh", c)) + "\t" + rate(r.find(r.Chain, "", d, "duplicate", c)) + "\t"
			for _, x := range r.Chain {
				if x.Dedup == d && x.Load == "duplicate" {
					hits, lookups = hits+x.CacheHits, lookups+x.CacheHits+x.CacheMisses
				}
			}
		}
		fmt.Fprintln(tw, row+percent(hits, lookups)+"\t")
	}
	tw.Flush()
	fmt.Fprintf(w, "\n## Ratios (rate of ours / rate of the other; 1.00 = as fast; redis = redisstore with the defaults)\n\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tc\tmemstore/watermill\tredis/watermill\tredis/none\tredis/naive\tredis/ceiling P1\tredis/ceiling P16\tpg/redis\tmysql/redis\t")
	for _, x := range r.Ratios {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", x.Load, x.Concurrency, f2(x.MemstoreVsWatermill), f2(x.RedisVsWatermill),
			f3(x.RedisVsNone), f2(x.RedisVsNaive), f2(x.RedisVsCeiling), f2(x.RedisVsPipelinedCeiling), f2(x.PGVsRedis), f2(x.MySQLVsRedis))
	}
	tw.Flush()
}

// print prints the c=1 latency section.
func (l *Latency) print(w io.Writer) {
	fmt.Fprintf(w, "\n## Fresh messages at c=1, redisstore auto-pipelining off and on (µs per message; %d rounds each, alternating, %.0fs per round)\n\n", l.Rounds, l.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "auto-pipelining\tmedian\tmin\tmax\trounds\t")
	for _, x := range []struct {
		name string
		s    Spread
	}{{"off", l.Off}, {"on", l.On}} {
		rounds := make([]string, len(x.s.Micros))
		for i, v := range x.s.Micros {
			rounds[i] = fmt.Sprintf("%.1f", v)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%s\t\n", x.name, x.s.Median, x.s.Min, x.s.Max, strings.Join(rounds, " "))
	}
	tw.Flush()
	fmt.Fprintf(w, "rule: %s: %s\n", l.Rule, metWord(l.Met))
}

// print prints the Redis ceiling section, with ours, our fresh rate at the
// ceiling's concurrency in the chain section (0 when not measured).
func (ce *Ceiling) print(w io.Writer, ours float64) {
	fmt.Fprintf(w, "\n## Redis ceiling (%d clients, same Redis)\n\n", ce.Clients)
	fmt.Fprintf(w, "redis-benchmark -P 1 claim:    %s claims/s  -> message ceiling %s msg/s (a fresh message: %s)\n", rate(ce.RedisBenchmarkClaims), rate(ce.MessageCeiling), ce.Commands)
	fmt.Fprintf(w, "redis-benchmark -P %d claim:   %s claims/s  -> message ceiling %s msg/s\n", ce.Pipeline, rate(ce.RedisBenchmarkClaimsPipelined), rate(ce.MessageCeilingPipelined))
	fmt.Fprintf(w, "go-redis raw claim:            %s claims/s\n", rate(ce.GoClaims))
	fmt.Fprintf(w, "go-redis raw claim+complete:   %s msg/s\n", rate(ce.GoMessages))
	if ours > 0 {
		fmt.Fprintf(w, "ours (middleware+redisstore):  %s msg/s fresh = %.0f%% of the -P 1 ceiling, %.0f%% of the -P %d ceiling, %.0f%% of the go-redis raw pairs\n",
			rate(ours), 100*div(ours, ce.MessageCeiling), 100*div(ours, ce.MessageCeilingPipelined), ce.Pipeline, 100*div(ours, ce.GoMessages))
	}
	printNote(w, ce.Note)
}

// print prints the command floor section.
func (f *Floor) print(w io.Writer) {
	fmt.Fprintf(w, "\n## Command floor (%s; %d connections, pipelines of %d commands; %d rounds of %.0fs per load and side, alternating)\n\n",
		f.Server, f.Clients, f.Pipeline, f.Rounds, f.Seconds)
	for _, x := range []struct {
		what string
		cmds []string
	}{{"ours, claim:    ", f.OursClaim}, {"ours, complete: ", f.OursComplete}, {"ours, duplicate:", f.OursDuplicate}} {
		fmt.Fprintf(w, "%s %s\n", x.what, strings.Join(x.cmds, " ; "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tside\tcommands per message\tmsg/s (median)\trounds (msg/s)\tRedis µs/msg (commandstats)\tRedis CPU µs/msg\tRedis busy\t")
	for _, p := range []struct {
		load, floor string
		pair        FloorPair
	}{{"fresh", "floor", f.Fresh}, {"duplicate", "GET", f.Duplicate}} {
		for _, x := range []struct {
			side string
			l    FloorLoad
		}{{p.floor, p.pair.Floor}, {"ours", p.pair.Ours}} {
			rounds := make([]string, len(x.l.Rates))
			for i, v := range x.l.Rates {
				rounds[i] = rate(v)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f (%s)\t%s\t%s\t%.2f\t%.2f\t%.0f%%\t\n", p.load, x.side, x.l.CommandsPerMessage, x.l.Commands,
				rate(x.l.PerSecond), strings.Join(rounds, " "), x.l.RedisUsec, x.l.RedisCPUUsec, 100*x.l.RedisBusy)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "fresh:      ours ÷ floor rate %s (median of the rounds' ratios); Redis time per message %s× the floor's (commandstats), %s× (CPU)\n",
		f2(f.Fresh.RateRatio), f2(f.Fresh.UsecRatio), f2(div(f.Fresh.Ours.RedisCPUUsec, f.Fresh.Floor.RedisCPUUsec)))
	fmt.Fprintf(w, "duplicate:  ours ÷ GET rate %s; Redis time per message %s× GET's (commandstats), %s× (CPU)\n",
		f2(f.Duplicate.RateRatio), f2(f.Duplicate.UsecRatio), f2(div(f.Duplicate.Ours.RedisCPUUsec, f.Duplicate.Floor.RedisCPUUsec)))
	printNote(w, f.Note)
}

// print prints the Redis cost per message.
func (s *Stats) print(w io.Writer) {
	fmt.Fprintf(w, "\n## Redis cost per message (%s, %d messages per cell)\n\n", s.Server, s.Messages)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tauto-pipelining\tc\tcommands (Redis)\tcommands (client)\tround trips\tcache hits\t")
	for _, x := range s.Cost {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%s\t\n", x.Load, onOff(x.AutoPipelining), x.Concurrency,
			x.ServerCommands, x.ClientCommands, x.RoundTrips, percent(x.CacheHits, x.CacheHits+x.CacheMisses))
	}
	tw.Flush()
	fmt.Fprintf(w, "commands run inside the scripts per fresh message: %.2f (not round trips)\n", s.FreshScriptInner)
	fmt.Fprintf(w, "handler %s, lease %s:  %.2f commands/message (renewals every lease/3)\n", s.SlowHandler.Handler, s.SlowHandler.Lease, s.SlowHandler.CommandsPerMessage)
	fmt.Fprintf(w, "handler %s, lease %s:   %.2f commands/message\n", s.FastHandler.Handler, s.FastHandler.Lease, s.FastHandler.CommandsPerMessage)
	fmt.Fprintf(w, "memory per COMPLETED key (%d-byte key, %s):  no output %.0f B (MEMORY USAGE), %.0f B (used_memory growth, incl. expiry)\n", s.KeyBytes, s.Encoding, s.MemoryNoOutput, s.UsedMemoryNoOutput)
	fmt.Fprintf(w, "                                  with output (value %d bytes) %.0f B (MEMORY USAGE), %.0f B (used_memory growth)\n", s.OutputBytes, s.MemoryWithOutput, s.UsedMemoryWithOutput)
	printNote(w, s.Note)
}

// print prints the PostgreSQL round trips per message.
func (p *PGStats) print(w io.Writer) {
	fmt.Fprintf(w, "\n## PostgreSQL round trips per message (pgstore, local cache off; statements sent by the pool, pgx tracer; %d messages each)\n\n", p.Messages)
	fmt.Fprintf(w, "fresh message:                          %.2f  (claim + complete)\n", p.Fresh)
	fmt.Fprintf(w, "duplicate:                              %.2f  (the claim finds it COMPLETED)\n", p.Duplicate)
	fmt.Fprintf(w, "fresh, completion in the handler's tx:  %.2f  outside the handler's transaction (the claim)\n", p.FreshTx)
	fmt.Fprintf(w, "                                        + %.2f statements in the handler's transaction (BEGIN, INSERT, CompleteInTx, COMMIT), %.2f of them the store's\n", p.TxHandler, p.TxStore)
	fmt.Fprintf(w, "statements prepared while measuring:    %d (pgx prepares each once per connection)\n", p.Prepares)
}

// print prints the MySQL round trips per message.
func (p *MySQLStats) print(w io.Writer) {
	fmt.Fprintf(w, "\n## MySQL round trips per message (mysqlstore, local cache off; counted on the driver's connections; %d messages each)\n\n", p.Messages)
	fmt.Fprintf(w, "fresh message:                          %.2f  (claim: write + read; complete)\n", p.Fresh)
	fmt.Fprintf(w, "duplicate:                              %.2f  (the claim, write + read, finds it COMPLETED)\n", p.Duplicate)
	fmt.Fprintf(w, "fresh, completion in the handler's tx:  %.2f  outside the handler's transaction (the claim)\n", p.FreshTx)
	fmt.Fprintf(w, "                                        + %.2f in the handler's transaction (SET TRANSACTION ISOLATION LEVEL, START TRANSACTION, INSERT prepared and run, CompleteInTx, COMMIT), %.2f of them the store's\n", p.TxHandler, p.TxStore)
	fmt.Fprintf(w, "statements prepared while measuring:    %d (the store's once per connection; the handler's INSERT each time)\n", p.Prepares)
}

// printE2E prints the end-to-end section, if it ran.
func (r *report) printE2E(w io.Writer) {
	if len(r.E2E) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## End to end through a Watermill router (messages/s, %d messages per cell, first to last handled; idem = ours, floor = SET NX / SET XX)\n\n", r.Config.N)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "broker\tc\tnone fresh\tidem fresh\tfloor fresh\tidem/none\tidem/floor\tnone dup\tidem dup\tfloor dup\tidem/none\tidem/floor\tdup cache hits\tnotes\t")
	for _, b := range r.Config.Brokers {
		for _, c := range r.Config.Concurrency {
			var cells []string
			for _, load := range []string{"fresh", "duplicate"} {
				none, idem, floor := r.find(r.E2E, b, "none", load, c), r.find(r.E2E, b, "idem", load, c), r.find(r.E2E, b, "floor", load, c)
				cells = append(cells, rate(none), rate(idem), rate(floor), ratio(idem, none), ratio(idem, floor))
			}
			var notes []string
			hits := "-"
			for _, x := range r.E2E {
				if x.Broker == b && x.Concurrency == c && x.Note != "" {
					notes = append(notes, x.Dedup+"/"+x.Load+": "+x.Note)
				}
				if x.Broker == b && x.Concurrency == c && x.Dedup == "idem" && x.Load == "duplicate" {
					hits = percent(x.CacheHits, x.CacheHits+x.CacheMisses)
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t\n", b, c, strings.Join(cells, "\t"), hits, strings.Join(notes, "; "))
		}
	}
	tw.Flush()
	r.printE2ECPU(w)
}

// printE2ECPU prints the CPU per message of each e2e cell: this process's
// (router, broker client, middleware) and the store's Redis's, from the
// router's start to its close. Read beside the rates: on two shared cores a
// microsecond spent here is one the broker and Redis do not get.
func (r *report) printE2ECPU(w io.Writer) {
	fmt.Fprintf(w, "\nCPU µs per message, this process + the store's Redis (main thread), and Redis's reads per message (batches; fewer is larger), same cells:\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "broker\tc\tload\tnone\tidem\tfloor\tidem - floor\tidem reads\tfloor reads\t")
	cpu := func(x Rate) string { return fmt.Sprintf("%.1f + %.1f", x.ClientCPU, x.RedisCPU) }
	for _, b := range r.Config.Brokers {
		for _, c := range r.Config.Concurrency {
			for _, load := range []string{"fresh", "duplicate"} {
				cells := []string{b, strconv.Itoa(c), load}
				var idem, floor *Rate
				for _, dedup := range e2eDedups {
					x := r.findRate(r.E2E, b, dedup, load, c)
					if x == nil {
						cells = append(cells, "-")
						continue
					}
					cells = append(cells, cpu(*x))
					switch dedup {
					case "idem":
						idem = x
					case "floor":
						floor = x
					}
				}
				diff, idemReads, floorReads := "-", "-", "-"
				if idem != nil && floor != nil {
					diff = cpu(Rate{ClientCPU: idem.ClientCPU - floor.ClientCPU, RedisCPU: idem.RedisCPU - floor.RedisCPU})
				}
				if idem != nil {
					idemReads = fmt.Sprintf("%.2f", idem.RedisReads)
				}
				if floor != nil {
					floorReads = fmt.Sprintf("%.2f", floor.RedisReads)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", strings.Join(cells, "\t"), diff, idemReads, floorReads)
			}
		}
	}
	tw.Flush()
}

// printTargets prints the targets table, always last.
func (r *report) printTargets(w io.Writer) {
	fmt.Fprintf(w, "\n## Targets (%d met, %d missed, %d not measured)\n\n", r.countTargets(resultMet), r.countTargets(resultMissed), r.countTargets(resultNotMeasured))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\ttarget\tmeasured\tresult")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Figure, t.Target, t.Measured, t.Result)
	}
	tw.Flush()
}

func (r *report) countTargets(result string) int {
	n := 0
	for _, t := range r.Targets {
		if t.Result == result {
			n++
		}
	}
	return n
}

func metWord(met bool) string {
	if met {
		return resultMet
	}
	return resultMissed
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// printNote prints a section's note, if it has one.
func printNote(w io.Writer, note string) {
	if note != "" {
		fmt.Fprintln(w, "note:", note)
	}
}

// percent formats part of whole, "-" for none.
func percent(part, whole uint64) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}

func f2(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

func f3(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", x)
}
