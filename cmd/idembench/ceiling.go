package main

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/csv"
	"errors"
	"fmt"
	"log"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Ceiling is what the Redis under test does with our scripts alone.
type Ceiling struct {
	ClaimSHA  string `json:"claim_sha"`
	FinishSHA string `json:"finish_sha"`
	Clients   int    `json:"clients"`
	// RedisBenchmarkClaims is redis-benchmark -c Clients -P 1 EVALSHA of
	// the claim script on random fresh keys, per second (0 when
	// redis-benchmark is not on PATH).
	RedisBenchmarkClaims float64 `json:"redis_benchmark_claims"`
	// GoClaims is the same load from Clients goroutines of a raw go-redis
	// client (no middleware, no store code), per second.
	GoClaims float64 `json:"go_claims"`
	// GoMessages is claim+complete pairs (one fresh message each) from
	// Clients goroutines of a raw go-redis client, per second.
	GoMessages float64 `json:"go_messages"`
	// MessageCeiling is RedisBenchmarkClaims/2 (a fresh message costs two
	// script calls), or GoClaims/2 without redis-benchmark.
	MessageCeiling float64 `json:"message_ceiling"`
	// Pipeline is the depth of the pipelined run (-P), and
	// RedisBenchmarkClaimsPipelined its claims per second: redis-benchmark
	// -c Clients -P Pipeline, same script and keys (0 without
	// redis-benchmark).
	Pipeline                      int     `json:"pipeline"`
	RedisBenchmarkClaimsPipelined float64 `json:"redis_benchmark_claims_pipelined"`
	// MessageCeilingPipelined is RedisBenchmarkClaimsPipelined/2.
	MessageCeilingPipelined float64 `json:"message_ceiling_pipelined"`
	Note                    string  `json:"note,omitempty"`
}

// scriptSHAs learns the SHAs of the claim and finish scripts by watching the
// store send them: one claim and one complete on a throwaway key.
func scriptSHAs(addr, prefix string) (claim, finish string) {
	rec := &shaRecorder{}
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
	defer c.Close()
	c.AddHook(rec)
	s := newRedisStore(c, true)
	ctx := context.Background()
	key := prefix + ":sha"
	token := idempotency.NewToken()
	if _, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute}); err != nil {
		log.Fatalf("Redis at %s: %v", addr, err)
	}
	if err := s.Complete(ctx, key, token, nil, time.Minute); err != nil {
		log.Fatal(err)
	}
	_ = s.Delete(ctx, key)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.shas) < 2 {
		log.Fatalf("saw %d EVALSHA, want claim and complete", len(rec.shas))
	}
	return rec.shas[0], rec.shas[len(rec.shas)-1]
}

// ceilingClients is the concurrency of the ceiling, and ceilingPipeline the
// depth of its pipelined run.
const (
	ceilingClients  = 64
	ceilingPipeline = 16
)

func runCeiling(o options, rc *redis.Client) Ceiling {
	ctx := context.Background()
	ce := Ceiling{Clients: ceilingClients, Pipeline: ceilingPipeline}
	ce.ClaimSHA, ce.FinishSHA = scriptSHAs(o.redisAddr, o.prefix)
	warmPool(rc, 2*ceilingClients)
	leaseMs := strconv.FormatInt(idempotency.DefaultLeaseTTL.Milliseconds(), 10)
	ttlMs := strconv.FormatInt(time.Hour.Milliseconds(), 10)

	var seq atomic.Uint64
	key := func() string { return o.prefix + ":ceil:" + strconv.FormatUint(seq.Add(1), 10) }
	n, secs := hammer(ceilingClients, o.ceilingDur, func() error {
		return rc.EvalSha(ctx, ce.ClaimSHA, []string{key()}, "0123456789abcdef0123456789abcdef", leaseMs, ttlMs, "").Err()
	})
	ce.GoClaims = float64(n) / secs
	cleanup(rc, o.prefix+":ceil:")

	n, secs = hammer(ceilingClients, o.ceilingDur, func() error {
		k, tok := key(), "0123456789abcdef0123456789abcdef"
		if err := rc.EvalSha(ctx, ce.ClaimSHA, []string{k}, tok, leaseMs, ttlMs, "").Err(); err != nil {
			return err
		}
		owner := sha1.Sum([]byte(tok)) // the complete script's owner field (redisstore's prelude.lua)
		return rc.EvalSha(ctx, ce.FinishSHA, []string{k}, tok, ttlMs, "", string(owner[:8])).Err()
	})
	ce.GoMessages = float64(n) / secs
	cleanup(rc, o.prefix+":ceil:")

	var notes []string
	rb := func(pipeline int, expected float64) float64 {
		// redis-benchmark stops by count only: about o.ceilingDur at the
		// expected rate.
		n := max(10_000, int(o.ceilingDur.Seconds()*expected))
		rps, err := redisBenchmark(o.redisAddr, redisBenchmarkArgs(o.prefix+":rb:", ce.ClaimSHA, leaseMs, ttlMs, pipeline, n))
		cleanup(rc, o.prefix+":rb:")
		if err != nil {
			notes = append(notes, fmt.Sprintf("redis-benchmark -P %d: %v", pipeline, err))
		}
		return rps
	}
	ce.RedisBenchmarkClaims = rb(1, 60_000)
	if ce.RedisBenchmarkClaims > 0 {
		ce.MessageCeiling = ce.RedisBenchmarkClaims / 2
		// Pipelining multiplies the rate by a few on one Redis core.
		ce.RedisBenchmarkClaimsPipelined = rb(ceilingPipeline, 3*ce.RedisBenchmarkClaims)
		ce.MessageCeilingPipelined = ce.RedisBenchmarkClaimsPipelined / 2
	} else {
		ce.MessageCeiling = ce.GoClaims / 2
		notes = append(notes, "ceiling from the Go load generator; no pipelined ceiling")
	}
	ce.Note = strings.Join(notes, "; ")
	return ce
}

// redisBenchmarkArgs are the arguments of redis-benchmark after its address:
// ceilingClients clients sending n EVALSHA of the claim script, pipeline
// deep, each on a random fresh key under prefix, with CSV output.
func redisBenchmarkArgs(prefix, sha, leaseMs, ttlMs string, pipeline, n int) []string {
	return []string{"-c", strconv.Itoa(ceilingClients), "-P", strconv.Itoa(pipeline), "-n", strconv.Itoa(n),
		"-r", "1000000000", "--csv",
		"EVALSHA", sha, "1", prefix + "__rand_int__", "0123456789abcdef0123456789abcdef", leaseMs, ttlMs, ""}
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
