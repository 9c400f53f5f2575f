package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRedisBenchmarkCSV(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  string
		rps  float64
	}{
		{"redis 7, header row", `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"EVALSHA 1f2e idem:__rand_int__","78213.44","0.805","0.112","0.775","1.183","1.551","4.447"
`, 78213.44},
		{"redis 6, no header", `"EVALSHA","61000.50"
`, 61000.50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rps, err := parseRedisBenchmarkCSV([]byte(tc.out))
			require.NoError(t, err)
			assert.InDelta(t, tc.rps, rps, 1e-9)
		})
	}
	for _, bad := range []string{"", "ERR unknown command\n", `"test","rps"` + "\n", `"EVALSHA","-1"` + "\n"} {
		_, err := parseRedisBenchmarkCSV([]byte(bad))
		assert.Error(t, err, "%q", bad)
	}
}

func TestSpreadAndLatencyRule(t *testing.T) {
	odd := newSpread([]float64{130, 110, 120})
	assert.Equal(t, Spread{Micros: []float64{130, 110, 120}, Median: 120, Min: 110, Max: 130}, odd)
	assert.Equal(t, 115.0, newSpread([]float64{130, 100, 110, 120}).Median)
	assert.Equal(t, Spread{}, newSpread(nil))

	off := newSpread([]float64{100, 110, 130})
	assert.True(t, latencyMet(off, newSpread([]float64{125, 130, 140})), "median 130 = slowest round without")
	assert.True(t, latencyMet(off, newSpread([]float64{90, 95, 99})), "faster")
	assert.False(t, latencyMet(off, newSpread([]float64{125, 131, 140})), "median above every round without")
	assert.False(t, latencyMet(Spread{}, off), "nothing measured")
}

func TestTargetCheck(t *testing.T) {
	for _, tc := range []struct {
		value   float64
		compare string
		bound   float64
		want    string
	}{
		{1.2, "<=", 1.2, resultMet},
		{1.21, "<=", 1.2, resultMissed},
		{149.9, "<", 150, resultMet},
		{150, "<", 150, resultMissed},
		{0.8, ">=", 0.8, resultMet},
		{0.79, ">=", 0.8, resultMissed},
		{2.004, "==", 2, resultMet},
		{2.01, "==", 2, resultMissed},
		{1.99, "==", 2, resultMissed},
	} {
		got := Target{}.check(tc.value, tc.compare, tc.bound)
		assert.Equal(t, tc.want, got.Result, "%v %s %v", tc.value, tc.compare, tc.bound)
		assert.Equal(t, Target{Result: tc.want, Value: tc.value, Compare: tc.compare, Bound: tc.bound}, got)
	}
}

// targetIDs are the targets of every report, in table order: a program
// reading the JSON finds them by these.
var targetIDs = []string{
	"fresh_commands_vs_floor", "dup_commands_vs_get",
	"e2e_c64_fresh_vs_floor_gochannel", "e2e_c64_fresh_vs_floor_kafka", "e2e_c64_fresh_vs_floor_redis",
	"e2e_c64_fresh_vs_floor_amqp", "e2e_c64_fresh_vs_floor_nats",
	"dup_warm_redis_commands",
	"dup_warm_chain_vs_watermill_c1",
	"dup_warm_chain_vs_watermill_c64",
	"fresh_c64_vs_pipelined_ceiling",
	"fresh_c1_latency",
	"e2e_c64_fresh_redis", "e2e_c64_fresh_amqp", "e2e_c64_fresh_nats",
	"e2e_c64_duplicate_redis", "e2e_c64_duplicate_amqp", "e2e_c64_duplicate_nats",
	"fresh_redis_commands",
	"dup_nocache_redis_commands",
	"renewals",
	"completed_key_bytes",
	"fresh_c64_vs_ceiling",
	"pg_fresh_statements", "pg_duplicate_statements", "pg_fresh_tx_statements",
	"mysql_fresh_statements", "mysql_duplicate_statements", "mysql_fresh_tx_statements",
}

func ids(ts []Target) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

func TestTargetsOfAnEmptyRunAreNotMeasured(t *testing.T) {
	r := &report{Config: reportConfig{Concurrency: []int{1, 64}}}
	r.summarise()
	require.Equal(t, targetIDs, ids(r.Targets))
	for _, x := range r.Targets {
		assert.Equal(t, resultNotMeasured, x.Result, x.ID)
		assert.NotEmpty(t, x.Figure, x.ID)
		assert.NotEmpty(t, x.Target, x.ID)
		assert.NotEmpty(t, x.Measured, x.ID, "says what it needs")
	}
}

// fullReport is a report with every section, whose figures meet every
// target.
func fullReport() *report {
	r := &report{SchemaVersion: schemaVersion, Config: reportConfig{Concurrency: []int{1, 64}, Brokers: []string{"gochannel", "kafka", "redis", "amqp", "nats"}}}
	chain := map[string][4]float64{ // fresh c=1, dup c=1, fresh c=64, dup c=64
		"none":       {8e6, 11e6, 9e6, 12e6},
		"watermill":  {900e3, 1.7e6, 750e3, 2e6},
		"memstore":   {800e3, 1.7e6, 600e3, 1.6e6},
		"redisstore": {9000, 1.6e6, 70e3, 1.8e6},
		"naiveredis": {8000, 16e3, 50e3, 100e3},
	}
	for name, rates := range chain {
		for i, c := range []int{1, 1, 64, 64} {
			load := "fresh"
			if i%2 == 1 {
				load = "duplicate"
			}
			r.Chain = append(r.Chain, Rate{Section: "chain", Dedup: name, Load: load, Concurrency: c, PerSecond: rates[i]})
		}
	}
	r.Latency = &Latency{Rounds: 3, Off: newSpread([]float64{110, 120, 130}), On: newSpread([]float64{112, 118, 125}), Rule: latencyRule}
	r.Latency.Met = latencyMet(r.Latency.Off, r.Latency.On)
	r.Ceiling = &Ceiling{Clients: 64, Pipeline: 16, RedisBenchmarkClaims: 80e3, MessageCeiling: 40e3,
		RedisBenchmarkClaimsPipelined: 160e3, MessageCeilingPipelined: 80e3}
	r.Stats = &Stats{Messages: 1000, FastHandler: Renewals{Lease: "300ms", Handler: "50ms", CommandsPerMessage: 2},
		SlowHandler: Renewals{Lease: "300ms", Handler: "250ms", CommandsPerMessage: 4}, MemoryNoOutput: 136, KeyBytes: 48}
	for _, p := range []bool{false, true} {
		for _, c := range []int{1, 64} {
			rt := 1.0
			if p && c == 64 {
				rt = 0.1
			}
			r.Stats.Cost = append(r.Stats.Cost,
				Cost{Load: loadFresh, AutoPipelining: p, Concurrency: c, ServerCommands: 2, ClientCommands: 2, RoundTrips: 2 * rt},
				Cost{Load: loadDupNoCache, AutoPipelining: p, Concurrency: c, ServerCommands: 1, ClientCommands: 1, RoundTrips: rt},
				Cost{Load: loadDupWarm, AutoPipelining: p, Concurrency: c, CacheHits: 1000})
		}
	}
	r.PGStats = &PGStats{Fresh: 2, Duplicate: 1, FreshTx: 1, TxHandler: 4, TxStore: 1, Messages: 1000}
	r.MySQLStats = &MySQLStats{Fresh: 3, Duplicate: 2, FreshTx: 2, TxHandler: 6, TxStore: 1, Messages: 1000}
	r.Floor = &Floor{Server: "private redis-server", Clients: 64, Pipeline: 16, Rounds: 3, Seconds: 1,
		OursClaim: []string{"EVALSHA c 1 <key>"}, OursComplete: []string{"EVALSHA f 1 <key>"}, OursDuplicate: []string{"EVALSHA c 1 <key>"},
		Fresh:     floorPair([]float64{100e3, 120e3, 110e3}, []float64{60e3, 66e3, 70e3}, 2.2, 4), // 0.6, 0.55, 0.64
		Duplicate: floorPair([]float64{600e3, 700e3, 650e3}, []float64{400e3, 420e3, 300e3}, 0.3, 0.5)}
	for _, b := range []string{"gochannel", "kafka", "redis", "amqp", "nats"} {
		for _, load := range []string{"fresh", "duplicate"} {
			r.E2E = append(r.E2E,
				Rate{Section: "e2e", Broker: b, Dedup: "none", Load: load, Concurrency: 64, PerSecond: 20e3},
				Rate{Section: "e2e", Broker: b, Dedup: "idem", Load: load, Concurrency: 64, PerSecond: 17e3},
				Rate{Section: "e2e", Broker: b, Dedup: "floor", Load: load, Concurrency: 64, PerSecond: 18e3})
		}
	}
	return r
}

func TestTargetsMetAndMissed(t *testing.T) {
	r := fullReport()
	r.summarise()
	require.Equal(t, targetIDs, ids(r.Targets))
	for _, x := range r.Targets {
		assert.Equal(t, resultMet, x.Result, "%s: %s", x.ID, x.Measured)
	}

	// Each figure moved past its bound.
	r = fullReport()
	for i := range r.Chain {
		x := &r.Chain[i]
		if x.Dedup == "redisstore" && x.Load == "duplicate" {
			x.PerSecond = 1e6 // the Deduplicator's 1.7e6 and 2e6: 1.7x and 2x the time
		}
		if x.Dedup == "memstore" && x.Load == "fresh" && x.Concurrency == 1 {
			x.PerSecond = 600e3 // 1.5x the time
		}
		if x.Dedup == "redisstore" && x.Load == "fresh" && x.Concurrency == 64 {
			x.PerSecond = 27e3 // 0.34 of the pipelined ceiling, 0.675 of the other
		}
	}
	r.Latency.On = newSpread([]float64{131, 135, 140})
	r.Stats.Cost[2].ClientCommands = 0.01
	r.Stats.Cost[0].ServerCommands = 2.01
	r.Stats.Cost[1].ClientCommands = 1.5
	r.Stats.FastHandler.CommandsPerMessage = 4
	r.Stats.MemoryNoOutput = 150
	r.PGStats = &PGStats{Fresh: 3, Duplicate: 0, FreshTx: 2}
	r.MySQLStats = &MySQLStats{Fresh: 4, Duplicate: 1, FreshTx: 3}
	for i := range r.E2E {
		if r.E2E[i].Dedup == "idem" {
			r.E2E[i].PerSecond = 15e3 // 0.75 of none's, 0.83 of the floor's
		}
		if r.E2E[i].Dedup == "floor" {
			r.E2E[i].PerSecond = 19e3 // 0.79
		}
	}
	r.Floor.Fresh = floorPair([]float64{100e3, 120e3, 110e3}, []float64{49e3, 59e3, 70e3}, 2.2, 20) // 0.49, 0.49, 0.64
	r.Floor.Duplicate = floorPair([]float64{600e3, 700e3}, []float64{300e3, 340e3}, 0.3, 5)         // 0.5, 0.49: median 0.495
	r.summarise()
	require.Equal(t, targetIDs, ids(r.Targets))
	for _, x := range r.Targets {
		assert.Equal(t, resultMissed, x.Result, "%s: %s", x.ID, x.Measured)
	}
}

func TestRatioNearItsBoundShowsThreeDecimals(t *testing.T) {
	assert.Equal(t, "0.796", against(0.7959, 0.8))
	assert.Equal(t, "0.804", against(0.8041, 0.8))
	assert.Equal(t, "0.80", against(0.8, 0.8))
	assert.Equal(t, "0.79", against(0.794, 0.8))
	assert.Equal(t, "1.17", against(1.17, 1.2))

	r := fullReport()
	for i := range r.E2E {
		if r.E2E[i].Broker == "amqp" && r.E2E[i].Dedup == "idem" && r.E2E[i].Load == "duplicate" {
			r.E2E[i].PerSecond = 0.7959 * 20e3
		}
	}
	r.summarise()
	i := slices.IndexFunc(r.Targets, func(x Target) bool { return x.ID == "e2e_c64_duplicate_amqp" })
	require.GreaterOrEqual(t, i, 0)
	assert.Equal(t, resultMissed, r.Targets[i].Result)
	assert.True(t, strings.HasPrefix(r.Targets[i].Measured, "0.796 "), r.Targets[i].Measured)
}

func TestTimeRatioIsTheirRateOverOurs(t *testing.T) {
	r := fullReport()
	r.summarise()
	i := slices.IndexFunc(r.Targets, func(x Target) bool { return x.ID == "dup_warm_chain_vs_watermill_c1" })
	require.GreaterOrEqual(t, i, 0)
	assert.InDelta(t, 1.7e6/1.6e6, r.Targets[i].Value, 1e-9, "our time per message over the Deduplicator's")
	assert.Equal(t, "<=", r.Targets[i].Compare)
	assert.Equal(t, 1.2, r.Targets[i].Bound)
}

func TestPrintEndsWithTheTargetsTable(t *testing.T) {
	r := fullReport()
	r.summarise()
	var buf bytes.Buffer
	r.print(&buf)
	out := buf.String()
	for _, section := range []string{"## Middleware chain", "## Ratios", "## Fresh messages at c=1", "## Redis ceiling", "## Command floor",
		"## Redis cost per message", "## PostgreSQL round trips", "## End to end", "## Targets (29 met, 0 missed, 0 not measured)"} {
		assert.Contains(t, out, section)
	}
	targets := out[strings.Index(out, "## Targets"):]
	lines := strings.Split(strings.TrimSpace(targets), "\n")
	require.Len(t, lines, 2+1+len(targetIDs), "title, blank line, header, one row per target")
	assert.Regexp(t, `^figure\s+target\s+measured\s+result$`, lines[2])
	for i, x := range r.Targets {
		row := lines[3+i]
		assert.True(t, strings.HasPrefix(row, x.Figure), row)
		assert.True(t, strings.HasSuffix(row, x.Result), row)
		assert.Contains(t, row, x.Measured)
	}
}

// TestJSONSchema holds the report's JSON to the layout documented in the
// package documentation.
func TestJSONSchema(t *testing.T) {
	r := fullReport()
	r.summarise()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	assert.ElementsMatch(t, []string{"schema_version", "machine", "started", "prefix", "config", "chain", "latency", "ceiling", "floor",
		"stats", "pg_stats", "mysql_stats", "e2e", "ratios", "e2e_ratios", "targets"}, keys(doc))
	assert.ElementsMatch(t, []string{"sections", "n", "chain_seconds", "ceiling_seconds", "floor_seconds", "floor_rounds", "rounds",
		"stats_messages", "concurrency", "brokers"}, keys(doc["config"].(map[string]any)))
	floor := doc["floor"].(map[string]any)
	assert.ElementsMatch(t, []string{"server", "clients", "pipeline", "rounds", "seconds", "ours_claim", "ours_complete", "ours_duplicate",
		"fresh", "duplicate"}, keys(floor), "note left out when empty")
	assert.ElementsMatch(t, []string{"floor", "ours", "rate_ratio", "usec_ratio"}, keys(floor["fresh"].(map[string]any)))
	assert.ElementsMatch(t, []string{"commands", "commands_per_message", "messages", "rates", "per_second", "redis_usec", "redis_cpu_usec",
		"redis_busy"}, keys(floor["duplicate"].(map[string]any)["ours"].(map[string]any)))
	assert.ElementsMatch(t, []string{"broker", "concurrency", "load", "idem_vs_none", "idem_vs_floor"},
		keys(doc["e2e_ratios"].([]any)[0].(map[string]any)))
	assert.Equal(t, float64(schemaVersion), doc["schema_version"])
	targets := doc["targets"].([]any)
	require.Len(t, targets, len(targetIDs))
	assert.ElementsMatch(t, []string{"id", "figure", "target", "measured", "result", "value", "compare", "bound"},
		keys(targets[0].(map[string]any)))
	assert.ElementsMatch(t, []string{"rounds", "seconds", "off", "on", "rule", "met"}, keys(doc["latency"].(map[string]any)))
	assert.ElementsMatch(t, []string{"micros", "median", "min", "max"}, keys(doc["latency"].(map[string]any)["on"].(map[string]any)))
	assert.ElementsMatch(t, []string{"claim_sha", "finish_sha", "commands", "clients", "redis_benchmark_claims", "go_claims", "go_messages",
		"message_ceiling", "pipeline", "redis_benchmark_claims_pipelined", "message_ceiling_pipelined"}, keys(doc["ceiling"].(map[string]any)))
	stats := doc["stats"].(map[string]any)
	assert.ElementsMatch(t, []string{"server", "messages", "cost", "fresh_script_inner", "slow_handler", "fast_handler", "key_bytes",
		"memory_no_output", "used_memory_no_output", "memory_with_output", "used_memory_with_output", "output_bytes", "encoding"}, keys(stats))
	assert.ElementsMatch(t, []string{"load", "auto_pipelining", "concurrency", "server_commands", "client_commands", "round_trips",
		"cache_hits", "cache_misses"}, keys(stats["cost"].([]any)[0].(map[string]any)))
	assert.ElementsMatch(t, []string{"section", "dedup", "load", "concurrency", "messages", "seconds", "per_second"},
		keys(doc["chain"].([]any)[0].(map[string]any)), "omitempty fields left out when empty")
	assert.ElementsMatch(t, []string{"load", "concurrency", "memstore_vs_watermill", "redis_vs_watermill", "redis_vs_none", "redis_vs_naive",
		"pg_vs_redis", "mysql_vs_redis", "redis_vs_ceiling", "redis_vs_pipelined_ceiling"}, keys(doc["ratios"].([]any)[0].(map[string]any)))

	// Without its sections, a report still has its targets.
	empty := &report{}
	empty.summarise()
	b, err = json.Marshal(empty)
	require.NoError(t, err)
	doc = map[string]any{}
	require.NoError(t, json.Unmarshal(b, &doc))
	assert.ElementsMatch(t, []string{"schema_version", "machine", "started", "prefix", "config", "targets"}, keys(doc))
	assert.Len(t, doc["targets"], len(targetIDs))
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestPrintE2ECPU(t *testing.T) {
	r := &report{Config: reportConfig{Brokers: []string{"gochannel"}, Concurrency: []int{64}}}
	r.E2E = []Rate{
		{Broker: "gochannel", Concurrency: 64, Dedup: "none", Load: "fresh", ClientCPU: 10, RedisCPU: 0.5},
		{Broker: "gochannel", Concurrency: 64, Dedup: "idem", Load: "fresh", ClientCPU: 40.25, RedisCPU: 12, RedisReads: 0.5},
		{Broker: "gochannel", Concurrency: 64, Dedup: "floor", Load: "fresh", ClientCPU: 20, RedisCPU: 7, RedisReads: 0.25},
	}
	var b bytes.Buffer
	r.printE2ECPU(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	fresh := strings.Fields(lines[len(lines)-2])
	assert.Equal(t, []string{"gochannel", "64", "fresh", "10.0", "+", "0.5", "40.2", "+", "12.0", "20.0", "+", "7.0", "20.2", "+", "5.0", "0.50", "0.25"}, fresh)
	dup := strings.Fields(lines[len(lines)-1])
	assert.Equal(t, []string{"gochannel", "64", "duplicate", "-", "-", "-", "-", "-", "-"}, dup, "no cells measured")
}
