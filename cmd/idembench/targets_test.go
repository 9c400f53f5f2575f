package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTargetCheck(t *testing.T) {
	for _, c := range []struct {
		value   float64
		compare string
		bound   float64
		want    string
	}{
		{0.5, ">=", 0.5, "met"}, {0.49, ">=", 0.5, "missed"},
		{25, "<=", 25, "met"}, {25.1, "<=", 25, "missed"},
		{149, "<", 150, "met"}, {150, "<", 150, "missed"},
		{2.004, "==", 2, "met"}, {2.01, "==", 2, "missed"}, {0, "==", 0, "met"},
	} {
		got := Target{}.check(c.value, c.compare, c.bound, "")
		assert.Equal(t, c.want, got.Result, "%v %s %v", c.value, c.compare, c.bound)
	}
}

// fullReport is a run of every section, every target met but the e2e
// ratio on NATS and the CPU on gochannel.
func fullReport() *report {
	side := func(r, cpu float64) FloorSide { return FloorSide{Rates: []float64{r}, PerSecond: r, RedisCPU: cpu} }
	r := &report{
		Floor: &Floor{Fresh: FloorPair{Floor: side(100, 7), Ours: side(60, 14), RateRatio: 0.6},
			Duplicate: FloorPair{Floor: side(100, 2), Ours: side(80, 2.5), RateRatio: 0.8}},
		Stats: &Stats{MemoryUsage: 136, KeyBytes: 48, PG: &PGStats{Fresh: 2, Duplicate: 1, FreshTx: 1}},
	}
	for _, c := range []int{1, 64} {
		r.Stats.Cost = append(r.Stats.Cost, Cost{Load: "fresh", Concurrency: c, Commands: 2},
			Cost{Load: "duplicate-nocache", Concurrency: c, Commands: 1}, Cost{Load: "duplicate-warm", Concurrency: c})
	}
	for _, b := range brokerTitles {
		ours := 90.0
		if b.name == "nats" {
			ours = 70
		}
		r.E2E = append(r.E2E, Rate{Broker: b.name, Dedup: "none", Concurrency: 64, PerSecond: 200, ClientCPU: 20},
			Rate{Broker: b.name, Dedup: "idem", Concurrency: 64, PerSecond: ours, ClientCPU: 100, RedisCPU: 38},
			Rate{Broker: b.name, Dedup: "floor", Concurrency: 64, PerSecond: 100, ClientCPU: 60, RedisCPU: 11})
	}
	r.Targets = r.targets()
	return r
}

func TestTargets(t *testing.T) {
	empty := (&report{}).targets()
	require.Len(t, empty, 15)
	for _, x := range empty {
		assert.Equal(t, "not measured", x.Result, x.ID)
	}
	results := map[string]string{}
	for i, x := range fullReport().Targets {
		assert.Equal(t, empty[i].ID, x.ID, "the same targets in the same order")
		results[x.ID] = x.Result
	}
	assert.Equal(t, map[string]string{
		"fresh_commands_vs_floor": "met", "dup_commands_vs_get": "met",
		"e2e_c64_fresh_vs_floor_gochannel": "met", "e2e_c64_fresh_vs_floor_kafka": "met", "e2e_c64_fresh_vs_floor_redis": "met",
		"e2e_c64_fresh_vs_floor_amqp": "met", "e2e_c64_fresh_vs_floor_nats": "missed", "e2e_c64_fresh_cpu_gochannel": "missed",
		"fresh_redis_commands": "met", "duplicate_nocache_redis_commands": "met", "duplicate_warm_redis_commands": "met",
		"completed_key_bytes": "met", "pg_fresh_statements": "met", "pg_duplicate_statements": "met", "pg_fresh_tx_statements": "met",
	}, results)

	r := fullReport()
	r.Stats.Cost[4].Commands = 2.5 // duplicate-nocache at c=64
	for _, x := range r.targets() {
		if x.ID == "duplicate_nocache_redis_commands" {
			assert.Equal(t, "missed", x.Result)
			assert.Equal(t, "2.50", x.Measured, "the worst cell")
		}
	}
}

func TestRatioNearItsBoundShowsThreeDecimals(t *testing.T) {
	assert.Equal(t, "0.796", against(0.796, 0.8))
	assert.Equal(t, "0.80", against(0.8, 0.8))
	assert.Equal(t, "0.81", against(0.812, 0.8))
}

func TestPrintEndsWithTheTargetsTable(t *testing.T) {
	var buf bytes.Buffer
	fullReport().print(&buf)
	out := buf.String()
	for _, s := range []string{"## Command floor", "## Redis commands per message", "136 B", "## End to end", "## Targets (13 met, 2 missed, 0 not measured)"} {
		assert.Contains(t, out, s)
	}
	assert.Regexp(t, `gochannel\s+64\s+200\s+90\s+100\s+0\.90\s+20\.0 \+ 0\.0\s+100\.0 \+ 38\.0\s+60\.0 \+ 11\.0\s+40\.0 \+ 27\.0`, out)
	_, last, _ := strings.Cut(out, "## Targets")
	assert.Contains(t, last, "this process's CPU per message, ours − floor dedup  ≤ 25 µs")
	assert.Contains(t, last, "40.0 (100.0 vs 60.0 µs)")

	b, err := json.Marshal(fullReport())
	require.NoError(t, err)
	var rep map[string]any
	require.NoError(t, json.Unmarshal(b, &rep))
	assert.Len(t, rep["targets"], 15)
}
