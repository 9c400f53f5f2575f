package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"log"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Ceiling is what the Redis under test does with our store's commands alone.
type Ceiling struct {
	// ClaimSHA and FinishSHA are the scripts of the claim and the complete
	// when the store sends them as EVALSHA, "" for a plain command (the
	// claim of a fresh key is one SET).
	ClaimSHA  string `json:"claim_sha"`
	FinishSHA string `json:"finish_sha"`
	// Commands names the commands of a fresh message, claim then complete,
	// as the store sent them ("SET, EVALSHA").
	Commands string `json:"commands"`
	Clients  int    `json:"clients"`
	// RedisBenchmarkClaims is redis-benchmark -c Clients -P 1 of the
	// store's claim command on random fresh keys, per second (0 when
	// redis-benchmark is not on PATH, or the claim is more than one
	// command).
	RedisBenchmarkClaims float64 `json:"redis_benchmark_claims"`
	// GoClaims is the same load from Clients goroutines of a raw go-redis
	// client (no middleware, no store code), per second.
	GoClaims float64 `json:"go_claims"`
	// GoMessages is claim+complete pairs (one fresh message each) from
	// Clients goroutines of a raw go-redis client, per second.
	GoMessages float64 `json:"go_messages"`
	// MessageCeiling is RedisBenchmarkClaims over the commands of a fresh
	// message (2: claim and complete), or GoClaims over them without
	// redis-benchmark.
	MessageCeiling float64 `json:"message_ceiling"`
	// Pipeline is the depth of the pipelined run (-P), and
	// RedisBenchmarkClaimsPipelined its claims per second: redis-benchmark
	// -c Clients -P Pipeline, same command and keys (0 without
	// redis-benchmark).
	Pipeline                      int     `json:"pipeline"`
	RedisBenchmarkClaimsPipelined float64 `json:"redis_benchmark_claims_pipelined"`
	// MessageCeilingPipelined is RedisBenchmarkClaimsPipelined over the
	// commands of a fresh message.
	MessageCeilingPipelined float64 `json:"message_ceiling_pipelined"`
	Note                    string  `json:"note,omitempty"`
}

// ceilingClients is the concurrency of the ceiling, and ceilingPipeline the
// depth of its pipelined run.
const (
	ceilingClients  = 64
	ceilingPipeline = 16
)

// scriptSHA is the script of a call that is one EVALSHA, else "".
func scriptSHA(ts []cmdTemplate) string {
	if len(ts) == 1 && ts[0].name() == "evalsha" && len(ts[0].args) > 1 {
		return argString(ts[0].args[1])
	}
	return ""
}

// sendAll sends the commands of one call for key, one round trip each; a
// nil reply is an answer (the fresh claim's SET NX GET).
func sendAll(ctx context.Context, rc *redis.Client, ts []cmdTemplate, key string) error {
	for _, t := range ts {
		if err := rc.Do(ctx, t.with(key)...).Err(); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("%s: %w", t.name(), err)
		}
	}
	return nil
}

// runCeiling measures the commands the store sends, captured as the floor
// section captures them (captureStore), not a copy of them: whatever the
// store's claim becomes, the ceiling is of what it sends.
func runCeiling(o options, rc *redis.Client) Ceiling {
	ctx := context.Background()
	ce := Ceiling{Clients: ceilingClients, Pipeline: ceilingPipeline}
	sc, err := captureStore(ctx, o.redisAddr, o.prefix+":ceilcapture:")
	if err != nil {
		log.Fatalf("ceiling: Redis at %s: %v", o.redisAddr, err)
	}
	ce.ClaimSHA, ce.FinishSHA = scriptSHA(sc.claim), scriptSHA(sc.complete)
	ce.Commands = commandNames(sc.claim, sc.complete)
	perMessage := float64(len(sc.claim) + len(sc.complete))
	warmPool(rc, 2*ceilingClients)

	var seq atomic.Uint64
	key := func() string { return o.prefix + ":ceil:" + strconv.FormatUint(seq.Add(1), 10) }
	n, secs := hammer(ceilingClients, o.ceilingDur, func() error { return sendAll(ctx, rc, sc.claim, key()) })
	ce.GoClaims = float64(n) / secs
	cleanup(rc, o.prefix+":ceil:")

	// Every fresh key is claimed and completed by the captured token,
	// which is valid.
	n, secs = hammer(ceilingClients, o.ceilingDur, func() error {
		k := key()
		if err := sendAll(ctx, rc, sc.claim, k); err != nil {
			return err
		}
		return sendAll(ctx, rc, sc.complete, k)
	})
	ce.GoMessages = float64(n) / secs
	cleanup(rc, o.prefix+":ceil:")

	var notes []string
	args, argNote, err := redisBenchmarkCommand(sc.claim, o.prefix+":rb:")
	if argNote != "" {
		notes = append(notes, argNote)
	}
	rb := func(pipeline int, expected float64) float64 {
		if err != nil {
			return 0
		}
		// redis-benchmark stops by count only: about o.ceilingDur at the
		// expected rate.
		n := max(10_000, int(o.ceilingDur.Seconds()*expected))
		rps, rbErr := redisBenchmark(o.redisAddr, redisBenchmarkArgs(args, pipeline, n))
		cleanup(rc, o.prefix+":rb:")
		if rbErr != nil {
			notes = append(notes, fmt.Sprintf("redis-benchmark -P %d: %v", pipeline, rbErr))
		}
		return rps
	}
	if err != nil {
		notes = append(notes, fmt.Sprintf("redis-benchmark: %v", err))
	}
	ce.RedisBenchmarkClaims = rb(1, 60_000)
	if ce.RedisBenchmarkClaims > 0 {
		ce.MessageCeiling = ce.RedisBenchmarkClaims / perMessage
		// Pipelining multiplies the rate by a few on one Redis core.
		ce.RedisBenchmarkClaimsPipelined = rb(ceilingPipeline, 3*ce.RedisBenchmarkClaims)
		ce.MessageCeilingPipelined = ce.RedisBenchmarkClaimsPipelined / perMessage
	} else {
		ce.MessageCeiling = ce.GoClaims / perMessage
		notes = append(notes, "ceiling from the Go load generator; no pipelined ceiling")
	}
	ce.Note = strings.Join(notes, "; ")
	return ce
}

// redisBenchmarkCommand is the store's claim as redis-benchmark sends it:
// its one command with the key replaced by prefix__rand_int__ (a random
// fresh key). redis-benchmark takes its arguments from the command line,
// where no argument holds a NUL byte: NUL bytes are sent as 0x01, the
// argument's length kept, and note says so (Redis's cost of a SET does not
// depend on its value's bytes).
func redisBenchmarkCommand(claim []cmdTemplate, prefix string) (args []string, note string, _ error) {
	if len(claim) != 1 {
		return nil, "", fmt.Errorf("the claim is %d commands (%s), redis-benchmark sends one", len(claim), commandNames(claim))
	}
	replaced := false
	for _, a := range claim[0].with(prefix + "__rand_int__") {
		s := argString(a)
		if strings.IndexByte(s, 0) >= 0 {
			s, replaced = strings.ReplaceAll(s, "\x00", "\x01"), true
		}
		args = append(args, s)
	}
	if replaced {
		note = "redis-benchmark sends the claim's NUL bytes as 0x01 (same lengths)"
	}
	return args, note, nil
}

// redisBenchmarkArgs are the arguments of redis-benchmark after its address:
// ceilingClients clients sending n of command, pipeline deep, with CSV
// output.
func redisBenchmarkArgs(command []string, pipeline, n int) []string {
	return append([]string{"-c", strconv.Itoa(ceilingClients), "-P", strconv.Itoa(pipeline), "-n", strconv.Itoa(n),
		"-r", "1000000000", "--csv"}, command...)
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
