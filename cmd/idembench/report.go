package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

type report struct {
	Machine Machine
	Started string
	Prefix  string
	Config  struct {
		N              int
		ChainSeconds   float64
		CeilingSeconds float64
		Concurrency    []int
		Brokers        []string
	}
	Chain   []Rate   `json:",omitempty"`
	Ceiling Ceiling  `json:",omitzero"`
	Stats   Stats    `json:",omitzero"`
	PGStats PGStats  `json:",omitzero"`
	E2E     []Rate   `json:",omitempty"`
	Ratios  []Ratios `json:",omitempty"`
}

// Ratios compares ours (redisstore and memstore) with the others at one
// concurrency and load, from the chain section of the same run.
type Ratios struct {
	Load        string
	Concurrency int
	// Ours on memstore / Watermill's Deduplicator (rate ratio: below 1 is
	// slower; the target is within 1.3x, i.e. at least 0.77).
	MemstoreVsWatermill float64
	// Ours on Redis / no deduplication.
	RedisVsNone float64
	// Ours on Redis / the naive GET-then-SET reference.
	RedisVsNaive float64
	// Ours on PostgreSQL / ours on Redis (0 without -pg).
	PGVsRedis float64
	// Ours on Redis / the Redis ceiling for the same scripts (messages:
	// script rate/2 fresh, script rate for duplicates).
	RedisVsCeiling float64
}

func (r *report) find(rates []Rate, broker, dedup, load string, c int) float64 {
	for _, x := range rates {
		if x.Broker == broker && x.Dedup == dedup && x.Load == load && x.Concurrency == c {
			return x.PerSecond
		}
	}
	return 0
}

func div(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return a / b
}

func (r *report) ceilingFor(load string) float64 {
	if load == "fresh" {
		return r.Ceiling.MessageCeiling
	}
	return 2 * r.Ceiling.MessageCeiling // one script call per duplicate
}

func (r *report) summarise() {
	if len(r.Chain) == 0 {
		return
	}
	for _, c := range r.Config.Concurrency {
		for _, load := range []string{"fresh", "duplicate"} {
			ours := r.find(r.Chain, "", "redisstore", load, c)
			x := Ratios{Load: load, Concurrency: c,
				MemstoreVsWatermill: div(r.find(r.Chain, "", "memstore", load, c), r.find(r.Chain, "", "watermill", load, c)),
				RedisVsNone:         div(ours, r.find(r.Chain, "", "none", load, c)),
				RedisVsNaive:        div(ours, r.find(r.Chain, "", "naiveredis", load, c)),
				PGVsRedis:           div(r.find(r.Chain, "", "pgstore", load, c), ours),
			}
			if c == r.Ceiling.Clients {
				x.RedisVsCeiling = div(ours, r.ceilingFor(load))
			}
			r.Ratios = append(r.Ratios, x)
		}
	}
}

func (r *report) print(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "idembench %s  %s/%s  %d CPUs (GOMAXPROCS %d)  %s  %s\n", r.Started, m.GOOS, m.GOARCH, m.CPUs, m.GOMAXPROCS, m.GoVersion, m.CPUModel)
	if len(r.Chain) > 0 {
		fmt.Fprintf(w, "\n## Middleware chain, no broker (messages/s, %.0fs per cell; handler does nothing)\n\n", r.Config.ChainSeconds)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := "dedup\t"
		for _, c := range r.Config.Concurrency {
			head += fmt.Sprintf("fresh c=%d\tdup c=%d\t", c, c)
		}
		fmt.Fprintln(tw, head)
		for _, d := range chainDedups {
			if needsPG[d] && r.find(r.Chain, "", d, "fresh", r.Config.Concurrency[0]) == 0 {
				continue
			}
			row := d + "\t"
			for _, c := range r.Config.Concurrency {
				row += rate(r.find(r.Chain, "", d, "fresh", c)) + "\t" + rate(r.find(r.Chain, "", d, "duplicate", c)) + "\t"
			}
			fmt.Fprintln(tw, row)
		}
		tw.Flush()
		fmt.Fprintf(w, "\n## Ratios (rate of ours / rate of the other; 1.00 = as fast)\n\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "load\tc\tmemstore/watermill\tredis/none\tredis/naive\tredis/ceiling\tpg/redis\t")
		for _, x := range r.Ratios {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", x.Load, x.Concurrency, f2(x.MemstoreVsWatermill), f3(x.RedisVsNone), f2(x.RedisVsNaive), f2(x.RedisVsCeiling), f2(x.PGVsRedis))
		}
		tw.Flush()
	}
	if r.Ceiling.Clients > 0 {
		ce := r.Ceiling
		fmt.Fprintf(w, "\n## Redis ceiling (%d clients, no pipelining, same Redis)\n\n", ce.Clients)
		fmt.Fprintf(w, "redis-benchmark EVALSHA claim:   %s scripts/s  -> message ceiling %s msg/s (2 scripts per fresh message)\n", rate(ce.RedisBenchmarkClaims), rate(ce.MessageCeiling))
		fmt.Fprintf(w, "go-redis raw EVALSHA claim:      %s scripts/s\n", rate(ce.GoClaims))
		fmt.Fprintf(w, "go-redis raw claim+complete:     %s msg/s\n", rate(ce.GoMessages))
		if ours := r.find(r.Chain, "", "redisstore", "fresh", ce.Clients); ours > 0 {
			fmt.Fprintf(w, "ours (middleware+redisstore):    %s msg/s fresh = %.0f%% of the redis-benchmark ceiling, %.0f%% of the go-redis raw pairs\n",
				rate(ours), 100*div(ours, ce.MessageCeiling), 100*div(ours, ce.GoMessages))
		}
		if ce.Note != "" {
			fmt.Fprintln(w, "note:", ce.Note)
		}
	}
	if r.Stats.Server != "" {
		s := r.Stats
		fmt.Fprintf(w, "\n## Redis cost per message (%s)\n\n", s.Server)
		fmt.Fprintf(w, "commands per fresh message:  %.2f (Redis commandstats, top-level)  %.2f (client hook)  [+%.2f commands inside the scripts]\n", s.FreshServer, s.FreshClient, s.FreshScriptInner)
		fmt.Fprintf(w, "commands per duplicate:      %.2f (Redis commandstats, top-level)  %.2f (client hook)\n", s.DuplicateServer, s.DuplicateClient)
		fmt.Fprintf(w, "handler %s, lease %s:  %.2f commands/message (renewals every lease/3)\n", s.SlowHandler.Handler, s.SlowHandler.Lease, s.SlowHandler.CommandsPerMessage)
		fmt.Fprintf(w, "handler %s, lease %s:   %.2f commands/message\n", s.FastHandler.Handler, s.FastHandler.Lease, s.FastHandler.CommandsPerMessage)
		fmt.Fprintf(w, "memory per COMPLETED key (%d-byte key, %s):  no output %.0f B (MEMORY USAGE), %.0f B (used_memory growth, incl. expiry)\n", s.KeyBytes, s.Encoding, s.MemoryNoOutput, s.UsedMemoryNoOutput)
		fmt.Fprintf(w, "                                  with output (value %d bytes) %.0f B (MEMORY USAGE), %.0f B (used_memory growth)\n", s.OutputBytes, s.MemoryWithOutput, s.UsedMemoryWithOutput)
		if s.Note != "" {
			fmt.Fprintln(w, "note:", s.Note)
		}
	}
	if p := r.PGStats; p.Messages > 0 {
		fmt.Fprintf(w, "\n## PostgreSQL round trips per message (pgstore; statements sent by the pool, pgx tracer; %d messages each)\n\n", p.Messages)
		fmt.Fprintf(w, "fresh message:                          %.2f  (claim + complete; target 2: %s)\n", p.Fresh, met(p.Fresh, 2))
		fmt.Fprintf(w, "duplicate:                              %.2f  (the claim finds it COMPLETED; target 1: %s)\n", p.Duplicate, met(p.Duplicate, 1))
		fmt.Fprintf(w, "fresh, completion in the handler's tx:  %.2f  outside the handler's transaction (the claim; target 1: %s)\n", p.FreshTx, met(p.FreshTx, 1))
		fmt.Fprintf(w, "                                        + %.2f statements in the handler's transaction (BEGIN, INSERT, CompleteInTx, COMMIT), %.2f of them the store's\n", p.TxHandler, p.TxStore)
		fmt.Fprintf(w, "statements prepared while measuring:    %d (pgx prepares each once per connection)\n", p.Prepares)
	}
	if len(r.E2E) > 0 {
		fmt.Fprintf(w, "\n## End to end through a Watermill router (messages/s, %d messages per cell, first to last handled)\n\n", r.Config.N)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "broker\tc\tnone fresh\tidem fresh\tidem/none\tnone dup\tidem dup\tidem/none\tnotes\t")
		for _, b := range r.Config.Brokers {
			for _, c := range r.Config.Concurrency {
				nf, f := r.find(r.E2E, b, "none", "fresh", c), r.find(r.E2E, b, "idem", "fresh", c)
				nd, d := r.find(r.E2E, b, "none", "duplicate", c), r.find(r.E2E, b, "idem", "duplicate", c)
				var notes []string
				for _, x := range r.E2E {
					if x.Broker == b && x.Concurrency == c && x.Note != "" {
						notes = append(notes, x.Dedup+"/"+x.Load+": "+x.Note)
					}
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", b, c, rate(nf), rate(f), ratio(f, nf), rate(nd), rate(d), ratio(d, nd), strings.Join(notes, "; "))
			}
		}
		tw.Flush()
	}
}

// met says whether a count per message is within target.
func met(x, target float64) string {
	if x <= target {
		return "met"
	}
	return "missed"
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
