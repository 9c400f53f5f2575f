package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

func TestCmdTemplateSubstitutesTheKeyOnly(t *testing.T) {
	key := "idem:orders:42"
	tmpl, err := newCmdTemplate([]any{"evalsha", "8835df00", int64(1), key, "tok", int64(60000), []byte(key), ""}, key)
	require.NoError(t, err)
	assert.Equal(t, []int{3, 6}, tmpl.keyAt, "string and []byte arguments equal to the key")
	assert.Equal(t, []any{"evalsha", "8835df00", int64(1), "idem:orders:43", "tok", int64(60000), "idem:orders:43", ""},
		tmpl.with("idem:orders:43"))
	assert.Equal(t, []any{"evalsha", "8835df00", int64(1), key, "tok", int64(60000), []byte(key), ""}, tmpl.args, "the template is left as it was")
	assert.Equal(t, "evalsha", tmpl.name())
	assert.Equal(t, `EVALSHA 8835df00 1 <key> tok 60000 <key> ""`, tmpl.String())

	long := strings.Repeat("r", 50)
	tmpl, err = newCmdTemplate([]any{"SET", key, long}, key)
	require.NoError(t, err)
	assert.Equal(t, "SET <key> "+strings.Repeat("r", 40)+"…", tmpl.String())
	assert.Equal(t, "set", tmpl.name(), "as INFO commandstats names it")

	for _, args := range [][]any{
		{"eval", "return redis.call('GET', '" + key + "')", 0},
		{"set", key + ":lock", "1"},
		{"hset", "other", "field", []byte("{" + key + "}")},
	} {
		_, err := newCmdTemplate(args, key)
		assert.ErrorContains(t, err, "inside a larger value", "%v", args)
	}
	_, err = newCmdTemplate(nil, key)
	assert.Error(t, err)
}

func TestCommandNames(t *testing.T) {
	fresh, dup := floorShapes()
	assert.Equal(t, "SET, SET", commandNames(fresh.first, fresh.second))
	assert.Equal(t, "GET", commandNames(dup.first, dup.second))
	assert.Equal(t, []string{"SET <key> 1 nx px 60000"}, templatesString(fresh.first))
	assert.Equal(t, []string{"SET <key> done xx px 86400000"}, templatesString(fresh.second))
}

func TestMessagesPerPipeline(t *testing.T) {
	fresh, dup := floorShapes()
	assert.Equal(t, 8, fresh.perPipeline(16), "8 claims and the 8 completes of the pipeline before")
	assert.Equal(t, 16, dup.perPipeline(16))
	three := msgShape{first: append(fresh.first, fresh.first...), second: fresh.second}
	assert.Equal(t, 5, three.perPipeline(16), "as many as fit")
	assert.Equal(t, 1, three.perPipeline(2), "at least one")
}

func TestPairedRatio(t *testing.T) {
	// Round ratios 0.5, 0.25, 0.4: the median is 0.4, where the ratio of
	// the medians would be 40/100.
	assert.InDelta(t, 0.4, pairedRatio([]float64{50, 30, 40}, []float64{100, 120, 100}), 1e-12)
	assert.InDelta(t, 0.45, pairedRatio([]float64{50, 0, 40}, []float64{100, 100, 100}), 1e-12, "a round without a rate left out")
	assert.Zero(t, pairedRatio(nil, []float64{1}))
	assert.Zero(t, pairedRatio([]float64{0}, []float64{0}))
}

func TestParseServerInfo(t *testing.T) {
	stats := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=200,usec=3000,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=4,usec=3,usec_per_call=0.75,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hset:calls=400,usec=600,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n")
	assert.Equal(t, map[string]cmdStat{"evalsha": {200, 3000}, "client|setinfo": {4, 3}, "hset": {400, 600}}, stats)

	cpu, ok := parseCPU("# CPU\r\nused_cpu_sys:10.5\r\nused_cpu_user:20.25\r\nused_cpu_sys_main_thread:1.5\r\nused_cpu_user_main_thread:2.25\r\n")
	assert.True(t, ok)
	assert.InDelta(t, 3.75, cpu, 1e-12, "the main thread's")
	cpu, ok = parseCPU("# CPU\r\nused_cpu_sys:10.5\r\nused_cpu_user:20.25\r\n")
	assert.True(t, ok)
	assert.InDelta(t, 30.75, cpu, 1e-12, "the process's, where the main thread's is not told")
	_, ok = parseCPU("")
	assert.False(t, ok)
}

func TestTopLevelUsec(t *testing.T) {
	before := map[string]cmdStat{"evalsha": {100, 1000}, "set": {10, 10}, "hset": {0, 0}}
	after := map[string]cmdStat{"evalsha": {300, 4000}, "set": {410, 810}, "hset": {400, 600}}

	usec, missing := topLevelUsec(before, after, map[string]int64{"evalsha": 200})
	assert.InDelta(t, 3000, usec, 1e-9, "the scripts' usec, not the commands they called inside")
	assert.Empty(t, missing)

	// 100 SETs sent, 400 counted: 300 ran inside scripts, whose usec
	// already holds them; a quarter of SET's usec is the load's own.
	usec, _ = topLevelUsec(before, after, map[string]int64{"evalsha": 200, "set": 100})
	assert.InDelta(t, 3000+800/4, usec, 1e-9)

	usec, missing = topLevelUsec(before, after, map[string]int64{"fcall": 200, "evalsha": 200})
	assert.InDelta(t, 3000, usec, 1e-9)
	assert.Equal(t, []string{"fcall"}, missing)
}

// floorPair returns a pair with its ratios computed.
func floorPair(floorRates, oursRates []float64, floorUsec, oursUsec float64) FloorPair {
	p := FloorPair{
		Floor: FloorLoad{Commands: "SET, SET", CommandsPerMessage: 2, Rates: floorRates, PerSecond: newSpread(floorRates).Median, RedisUsec: floorUsec, RedisCPUUsec: floorUsec, RedisBusy: 0.6},
		Ours:  FloorLoad{Commands: "EVALSHA, EVALSHA", CommandsPerMessage: 2, Rates: oursRates, PerSecond: newSpread(oursRates).Median, RedisUsec: oursUsec, RedisCPUUsec: oursUsec, RedisBusy: 0.95},
	}
	p.finish()
	return p
}

func TestFloorPrint(t *testing.T) {
	f := &Floor{Server: "private redis-server", Clients: 64, Pipeline: 16, Rounds: 2, Seconds: 1,
		OursClaim: []string{`EVALSHA 8835 1 <key> tok 60000 86400000 ""`}, OursComplete: []string{`EVALSHA 35b5 1 <key> tok 86400000 ""`},
		OursDuplicate: []string{`EVALSHA 8835 1 <key> tok2 60000 86400000 ""`},
		Fresh:         floorPair([]float64{180e3, 200e3}, []float64{45e3, 40e3}, 2.2, 22),
		Duplicate:     floorPair([]float64{700e3, 650e3}, []float64{100e3, 117e3}, 0.25, 7)}
	assert.InDelta(t, (0.25+0.2)/2, f.Fresh.RateRatio, 1e-12)
	assert.InDelta(t, 10, f.Fresh.UsecRatio, 1e-12)
	var buf bytes.Buffer
	f.print(&buf)
	out := buf.String()
	for _, s := range []string{
		"## Command floor (private redis-server; 64 connections, pipelines of 16 commands; 2 rounds of 1s per load and side, alternating)",
		`ours, claim:     EVALSHA 8835 1 <key> tok 60000 86400000 ""`,
		"fresh:      ours ÷ floor rate 0.23 (median of the rounds' ratios); Redis time per message 10.00× the floor's (commandstats), 10.00× (CPU)",
		"duplicate:  ours ÷ GET rate 0.16;",
	} {
		assert.Contains(t, out, s)
	}
	assert.Regexp(t, `fresh\s+floor\s+2 \(SET, SET\)\s+190k\s+180k 200k\s+2\.20\s+2\.20\s+60%`, out)
	assert.Regexp(t, `duplicate\s+ours\s+2 \(EVALSHA, EVALSHA\)\s+108k\s+100k 117k\s+7\.00\s+7\.00\s+95%`, out)
}

// TestCaptureAndReplay captures what the store sends on the shared Redis
// and replays it on other keys: the fresh messages must end COMPLETED, the
// duplicates must leave COMPLETED records as they were.
func TestCaptureAndReplay(t *testing.T) {
	ctx := context.Background()
	addr := testserver.RedisAddr(t)
	prefix := testserver.UniqueName("idembenchtest:") + ":"
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, PoolSize: floorConns + 8})
	t.Cleanup(func() {
		_ = rediskeys.Delete(context.Background(), c, prefix+"*")
		_ = c.Close()
	})
	b := &floorBench{c: c, store: newRedisStore(c, true), prefix: prefix}

	ours, err := captureStore(ctx, addr, prefix+"capture:")
	require.NoError(t, err)
	require.NotEmpty(t, ours.claim)
	require.NotEmpty(t, ours.complete)
	require.NotEmpty(t, ours.duplicate)
	t.Logf("claim %v, complete %v, duplicate %v", templatesString(ours.claim), templatesString(ours.complete), templatesString(ours.duplicate))
	n, err := c.Exists(ctx, prefix+"capture:template", prefix+"capture:warm").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the capture deletes its keys")

	// Fresh messages: every key ends COMPLETED after one attempt.
	key := b.freshKey(0, "o")
	run, err := runLoad(ctx, c, 20*time.Millisecond, msgShape{first: ours.claim, second: ours.complete, nilOK: true}, key)
	require.NoError(t, err)
	require.GreaterOrEqual(t, run.messages, int64(floorConns*8), "at least one pipeline per connection")
	for w, n := range run.counts {
		for i := range n {
			rec, err := b.store.Get(ctx, key(w, i))
			require.NoError(t, err)
			require.Equal(t, idempotency.StateCompleted, rec.State, key(w, i))
			require.Equal(t, 1, rec.Attempts, key(w, i))
		}
	}
	require.NoError(t, b.checkFresh(ctx, true, run, key))
	b.unlinkRun(ctx, run, key)
	n, err = c.Exists(ctx, key(0, 0), key(floorConns-1, run.counts[floorConns-1]-1)).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "unlinked")

	// Claims alone leave the keys IN_PROGRESS: the check tells.
	key = b.freshKey(0, "c")
	run, err = runLoad(ctx, c, 10*time.Millisecond, msgShape{first: ours.claim, nilOK: true}, key)
	require.NoError(t, err)
	assert.ErrorContains(t, b.checkFresh(ctx, true, run, key), "not COMPLETED")

	// The floor's fresh messages end "done"; its duplicates find them.
	floorFresh, floorDup := floorShapes()
	key = b.freshKey(0, "f")
	run, err = runLoad(ctx, c, 10*time.Millisecond, floorFresh, key)
	require.NoError(t, err)
	require.NoError(t, b.checkFresh(ctx, false, run, key))
	var done []string
	for w, n := range run.counts {
		for i := range n {
			done = append(done, key(w, i))
		}
	}
	_, err = runLoad(ctx, c, 10*time.Millisecond, floorDup, cycle(done))
	require.NoError(t, err)
	b.unlinkRun(ctx, run, key)
	_, err = runLoad(ctx, c, 10*time.Millisecond, floorDup, cycle(done))
	require.ErrorContains(t, err, "nil reply", "a GET of a key that is gone")

	// Duplicates: the replayed claims acquire nothing.
	dupKeys := []string{prefix + "dup:1", prefix + "dup:2", prefix + "dup:3"}
	attempts, err := b.completeKeys(ctx, dupKeys)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{dupKeys[0]: 1, dupKeys[1]: 1, dupKeys[2]: 1}, attempts)
	run, err = runLoad(ctx, c, 20*time.Millisecond, msgShape{first: ours.duplicate, nilOK: true}, cycle(dupKeys))
	require.NoError(t, err)
	require.Greater(t, run.messages, int64(len(dupKeys)))
	require.NoError(t, b.checkDuplicates(ctx, attempts))

	// ... which the check would tell: a key failed and claimed again.
	tok := idempotency.NewToken()
	res, err := b.store.Claim(ctx, prefix+"dup:4", idempotency.ClaimRequest{Token: tok, Lease: time.Minute, TTL: time.Minute})
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, b.store.Fail(ctx, prefix+"dup:4", tok, time.Minute))
	res, err = b.store.Claim(ctx, prefix+"dup:4", idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: time.Minute, TTL: time.Minute})
	require.NoError(t, err)
	require.True(t, res.Acquired)
	assert.ErrorContains(t, b.checkDuplicates(ctx, map[string]int{prefix + "dup:4": 1}), "acquired it")
}

// TestFloorDedup runs the e2e section's floor on the shared Redis: a fresh
// message runs the handler and ends "done", a duplicate does not run it, a
// failed handler leaves nothing behind.
func TestFloorDedup(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: testserver.RedisAddr(t)})
	prefix := testserver.UniqueName("idembenchtest:") + ":"
	t.Cleanup(func() {
		_ = rediskeys.Delete(context.Background(), c, prefix+"*")
		_ = c.Close()
	})
	f := newFloorDedup(c, prefix, time.Minute, time.Hour)
	runs := 0
	fail := false
	chain := f.Middleware(func(m *message.Message) ([]*message.Message, error) {
		runs++
		if fail {
			return nil, errors.New("handler failed")
		}
		return []*message.Message{message.NewMessage("out", nil)}, nil
	})
	msg := func(id string) *message.Message {
		m := message.NewMessage("uuid-"+id, nil)
		m.Metadata.Set("requestId", id)
		return m
	}

	out, err := chain(msg("a"))
	require.NoError(t, err)
	assert.Len(t, out, 1)
	assert.Equal(t, "done", c.Get(ctx, prefix+"a").Val())
	ttl := c.PTTL(ctx, prefix+"a").Val()
	assert.Greater(t, ttl, 59*time.Minute, "the TTL, not the lease")

	out, err = chain(msg("a"))
	require.NoError(t, err)
	assert.Empty(t, out, "a duplicate: acked, no output")
	assert.Equal(t, 1, runs)

	fail = true
	_, err = chain(msg("b"))
	require.Error(t, err)
	assert.Zero(t, c.Exists(ctx, prefix+"b").Val(), "a failed message's key deleted")
	fail = false
	_, err = chain(msg("b"))
	require.NoError(t, err)
	assert.Equal(t, 3, runs, "the redelivery ran it again")

	// Without requestId: the UUID.
	_, err = chain(message.NewMessage("uuid-c", nil))
	require.NoError(t, err)
	assert.Equal(t, "done", c.Get(ctx, prefix+"uuid-c").Val())
}
