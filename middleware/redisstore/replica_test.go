package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// startReplicated starts a private master with one replica in sync.
func startReplicated(t *testing.T) (master, replica *testserver.RedisServer) {
	master = testserver.StartRedis(t, "--repl-diskless-sync-delay", "0")
	_, port, err := net.SplitHostPort(master.Addr)
	require.NoError(t, err)
	replica = testserver.StartRedis(t, "--replicaof", "127.0.0.1", port)
	c := redis.NewClient(&redis.Options{Addr: master.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	require.Eventually(t, func() bool {
		n, err := c.Wait(context.Background(), 1, 50*time.Millisecond).Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the replica never connected")
	return master, replica
}

// TestReplicaAckOneRoundTrip proves that with Options.Replicas, while the
// replica keeps up, each of Claim, Renew and Complete is one round trip
// (one pipeline of EVALSHA and WAIT, from the client's count), that the
// server ran one EVALSHA and one WAIT for it, that only the transitions
// that wrote are counted (not a duplicate), and that Fail, Release and Get
// send no WAIT.
func TestReplicaAckOneRoundTrip(t *testing.T) {
	t.Parallel()
	master, _ := startReplicated(t)
	admin, client, hook := statClients(t, master.Addr)
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 2 * time.Second})
	require.NoError(t, err)
	ctx := context.Background()

	// The first call of a script on a server that does not know it: the
	// pipeline answers NOSCRIPT and is sent again with EVAL, which loads
	// it. Still one WAIT that counts.
	first := claimReq(time.Minute, nil)
	res, err := s.Claim(ctx, "first", first)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, admin.ConfigResetStat(ctx).Err())
	hook.reset()
	require.NoError(t, s.Renew(ctx, "first", first.Token, time.Minute))
	trips, cmds := hook.counts()
	assert.Equal(t, 2, trips, "NOSCRIPT: a second pipeline with EVAL")
	assert.Equal(t, 4, cmds)
	calls := commandCalls(t, admin)
	assert.Equal(t, 1, calls["evalsha"])
	assert.Equal(t, 1, calls["eval"])
	assert.Equal(t, 2, calls["wait"])
	loadScripts(t, s) // the other scripts
	acked := s.ReplicaStats().Acknowledged

	var token string
	steps := []struct {
		name        string
		wait, wrote bool
		run         func() error
	}{
		{"claim", true, true, claimStep(s, "k", nil, &token)},
		{"renew", true, true, func() error { return s.Renew(ctx, "k", token, time.Minute) }},
		{"complete", true, true, func() error { return s.Complete(ctx, "k", token, []byte("r"), time.Hour) }},
		// Its reply is the completion's: counted.
		{"complete resent", true, true, func() error { return s.Complete(ctx, "k", token, []byte("r"), time.Hour) }},
		{"duplicate claim", true, false, func() error {
			res, err := s.Claim(ctx, "k", claimReq(time.Minute, nil))
			if err == nil && res.Acquired {
				t.Errorf("duplicate acquired: %+v", res)
			}
			return err
		}},
		{"claim again", true, true, claimStep(s, "k2", nil, &token)},
		{"fail", false, false, func() error { return s.Fail(ctx, "k2", token, time.Hour) }},
		{"release", false, false, func() error { return s.Release(ctx, "k2", token) }},
		{"get", false, false, func() error { _, err := s.Get(ctx, "k"); return err }},
	}
	wrote := 0
	for _, step := range steps {
		trips, cmds, calls := scriptStep(t, admin, hook, step.name, step.run)
		assert.Equal(t, 1, trips, "%s: round trips", step.name)
		if step.wrote {
			wrote++
		}
		if step.wait {
			assert.Equal(t, 2, cmds, "%s: EVALSHA and WAIT in one pipeline", step.name)
			assert.Equal(t, 1, calls["wait"], "%s: WAIT calls, stats %v", step.name, calls)
		} else {
			assert.Equal(t, 1, cmds, "%s: one command", step.name)
			assert.Zero(t, calls["wait"], "%s: no WAIT, stats %v", step.name, calls)
		}
	}
	assert.Equal(t, redisstore.ReplicaStats{Acknowledged: acked + uint64(wrote)}, s.ReplicaStats(),
		"every transition that wrote was acknowledged by the replica")
}

// TestReplicaShortfall stops the replica: a Complete is still applied and
// succeeds (the effect happened), and the shortfall is counted, passed to
// the callback and logged. WAIT is bounded by the call's deadline, so a
// long ReplicaTimeout never makes a call outlive its context.
func TestReplicaShortfall(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: master.Addr})
	t.Cleanup(func() { _ = client.Close() })
	var (
		mu   sync.Mutex
		seen []redisstore.ReplicaShortfall
	)
	s, err := redisstore.New(client, &redisstore.Options{
		Replicas:       1,
		ReplicaTimeout: 4 * time.Second,
		OnReplicaShortfall: func(op, key string, acked int) {
			r := redisstore.ReplicaShortfall{Op: op, Key: key, Acked: acked, Wanted: 1}
			mu.Lock()
			seen = append(seen, r)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	ctx := context.Background()
	warm := claimReq(time.Minute, nil) // loads both scripts: one pipeline each below
	_, err = s.Claim(ctx, "warm", warm)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, "warm", warm.Token, nil, time.Minute))
	req := claimReq(time.Minute, nil)
	_, err = s.Claim(ctx, "k", req)
	require.NoError(t, err)
	require.Equal(t, redisstore.ReplicaStats{Acknowledged: 3}, s.ReplicaStats())

	replica.Stop()
	// The deadline, shorter than ReplicaTimeout, bounds WAIT (to half of
	// what is left), so the call returns in time.
	short, cancel := context.WithTimeout(ctx, time.Second)
	err = s.Complete(short, "k", req.Token, []byte("r"), time.Hour)
	cancel()
	require.NoError(t, err, "the completion was applied: it succeeds although no replica acknowledged it in time")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, redisstore.ReplicaStats{Acknowledged: 3, Shortfalls: 1}, s.ReplicaStats())
	mu.Lock()
	assert.Equal(t, []redisstore.ReplicaShortfall{{Op: "complete", Key: "k", Acked: 0, Wanted: 1}}, seen)
	mu.Unlock()

	// A lease lost is not a shortfall: the script changed nothing.
	err = s.Complete(ctx, "k", storekit.NewToken(), nil, time.Hour)
	require.ErrorIs(t, err, idempotency.ErrLeaseLost)
}

// TestReplicaShortfallOnlyForWrites: with the replica stopped, claims
// that write nothing (a duplicate of a COMPLETED key, a claim of a key
// another owner holds) and a Renew and a Complete of a lease lost are no
// shortfall: nothing is reported or logged. The first WAIT that falls
// short, even beside a call that wrote nothing, makes the store send WAIT
// only after a command that wrote, so those calls send no WAIT and do not
// wait out ReplicaTimeout; a claim that writes still waits and is
// reported. Once the replica is back, a WAIT is acknowledged and calls
// are one round trip again.
func TestReplicaShortfallOnlyForWrites(t *testing.T) {
	t.Parallel()
	master, replica := startReplicated(t)
	admin, client, hook := statClients(t, master.Addr)
	var (
		mu   sync.Mutex
		seen []redisstore.ReplicaShortfall
	)
	s, err := redisstore.New(client, &redisstore.Options{
		Replicas:       1,
		ReplicaTimeout: 2 * time.Second,
		OnReplicaShortfall: func(op, key string, acked int) {
			r := redisstore.ReplicaShortfall{Op: op, Key: key, Acked: acked, Wanted: 1}
			mu.Lock()
			seen = append(seen, r)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	loadScripts(t, s)
	ctx := context.Background()
	done, held := claimReq(time.Minute, nil), claimReq(time.Minute, nil)
	_, err = s.Claim(ctx, "done", done)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, "done", done.Token, []byte("out"), time.Hour))
	_, err = s.Claim(ctx, "held", held)
	require.NoError(t, err)
	acked := s.ReplicaStats().Acknowledged
	require.Equal(t, redisstore.ReplicaStats{Acknowledged: acked}, s.ReplicaStats())

	replica.Stop()
	waits := func(name string, run func() error) int {
		t.Helper()
		require.NoError(t, admin.ConfigResetStat(ctx).Err())
		require.NoError(t, run(), name)
		return commandCalls(t, admin)["wait"]
	}
	duplicate := func() error {
		res, err := s.Claim(ctx, "done", claimReq(time.Minute, nil))
		if err == nil && (res.Acquired || string(res.Record.Result) != "out") {
			t.Errorf("duplicate: %+v", res)
		}
		return err
	}
	refused := func() error {
		res, err := s.Claim(ctx, "held", claimReq(time.Minute, nil))
		if err == nil && res.Acquired {
			t.Errorf("a held key acquired: %+v", res)
		}
		return err
	}
	// The first call after the loss cannot know it: its WAIT goes in the
	// pipeline and falls short, but it wrote nothing and is not counted.
	assert.Equal(t, 1, waits("first duplicate", duplicate), "WAIT in the pipeline")
	assert.Zero(t, waits("duplicate", duplicate), "a duplicate sends no WAIT")
	assert.Zero(t, waits("claim of a held key", refused), "a refused claim sends no WAIT")
	lost := func(err error) error {
		if !errors.Is(err, idempotency.ErrLeaseLost) {
			return fmt.Errorf("want a lease lost, got %v", err)
		}
		return nil
	}
	assert.Zero(t, waits("renew of a lost lease", func() error { return lost(s.Renew(ctx, "held", storekit.NewToken(), time.Minute)) }))
	assert.Zero(t, waits("complete of a lost lease", func() error {
		return lost(s.Complete(ctx, "held", storekit.NewToken(), nil, time.Hour))
	}))
	assert.Equal(t, redisstore.ReplicaStats{Acknowledged: acked}, s.ReplicaStats(), "nothing written, no shortfall")
	mu.Lock()
	assert.Empty(t, seen)
	mu.Unlock()
	mu.Lock()
	assert.Empty(t, seen, "nothing reported")
	mu.Unlock()

	// A claim that writes waits, after its SET, and is reported.
	assert.Equal(t, 1, waits("fresh claim", func() error { _, err := s.Claim(ctx, "fresh", claimReq(time.Minute, nil)); return err }))
	assert.Equal(t, redisstore.ReplicaStats{Acknowledged: acked, Shortfalls: 1}, s.ReplicaStats())
	mu.Lock()
	assert.Equal(t, []redisstore.ReplicaShortfall{{Op: "claim", Key: "fresh", Acked: 0, Wanted: 1}}, seen)
	mu.Unlock()

	// The replica back in sync: a write's WAIT is acknowledged, and the
	// next call is one pipeline again.
	replica.Start()
	require.Eventually(t, func() bool {
		n, err := admin.Wait(ctx, 1, 50*time.Millisecond).Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the replica never came back")
	_, err = s.Claim(ctx, "back", claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.Equal(t, redisstore.ReplicaStats{Acknowledged: acked + 1, Shortfalls: 1}, s.ReplicaStats())
	hook.reset()
	assert.Equal(t, 1, waits("duplicate, replica back", duplicate))
	trips, cmds := hook.counts()
	assert.Equal(t, 1, trips, "one round trip")
	assert.Equal(t, 2, cmds, "SET and WAIT")
	assert.Equal(t, redisstore.ReplicaStats{Acknowledged: acked + 1, Shortfalls: 1}, s.ReplicaStats())
}

// TestReplicaAckOptions: out-of-range options are errors, and a ring,
// whose shards have no replicas and which could not keep WAIT on the
// script's connection, is refused.
func TestReplicaAckOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisstore.New(c, &redisstore.Options{Replicas: -1})
	assert.ErrorContains(t, err, "Replicas is -1")
	_, err = redisstore.New(c, &redisstore.Options{Replicas: 1, ReplicaTimeout: -time.Second})
	assert.ErrorContains(t, err, "ReplicaTimeout is -1s")
	_, err = redisstore.New(c, &redisstore.Options{Replicas: 1, ReplicaTimeout: c.Options().ReadTimeout})
	assert.ErrorContains(t, err, "shorter than the client's ReadTimeout")
	s, err := redisstore.New(c, &redisstore.Options{Replicas: 1})
	require.NoError(t, err)
	assert.Equal(t, redisstore.ReplicaStats{}, s.ReplicaStats())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	_, err = redisstore.New(ring, &redisstore.Options{Replicas: 1})
	assert.ErrorIs(t, err, redisstore.ErrReplicaAckUnsupported)
	_, err = redisstore.New(ring, &redisstore.Options{})
	assert.NoError(t, err)
}

// TestReplicaAckCluster: on a cluster client, WAIT goes to the node that
// ran the claim's SET (a keyless command would go to any node). The test
// cluster has no replicas, so every WAIT falls short and each fresh claim
// is counted; a claim of a held key writes nothing, sends no WAIT (once a
// WAIT on its node fell short; before, one in the pipeline) and is not
// counted.
func TestReplicaAckCluster(t *testing.T) {
	t.Parallel()
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 5 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	admins := map[string]*redis.Client{}
	for _, a := range addrs {
		admins[a] = redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = admins[a].Close() })
	}
	step := func(key, name string, check func(addr string, calls map[string]int)) {
		t.Helper()
		for _, admin := range admins {
			require.NoError(t, admin.ConfigResetStat(ctx).Err())
		}
		res, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
		require.NoError(t, err, "%s: %s", name, key)
		assert.Equal(t, name == "fresh", res.Acquired, "%s: %s", name, key)
		for a, admin := range admins {
			check(a, commandCalls(t, admin))
		}
	}
	for i := range 6 {
		key := "spread-" + strconv.Itoa(i)
		sets, scripts := 0, 0
		step(key, "fresh", func(a string, calls map[string]int) {
			assert.Equal(t, calls["set"], calls["wait"], "%s on %s: WAIT beside the SET, stats %v", key, a, calls)
			sets += calls["set"]
		})
		assert.Equal(t, 1, sets, key)
		step(key, "held", func(a string, calls map[string]int) {
			assert.Zero(t, calls["wait"], "%s on %s: no WAIT, stats %v", key, a, calls)
			if calls["evalsha"] > 0 {
				scripts++
			}
		})
		assert.Equal(t, 1, scripts, key)
	}
	assert.Equal(t, redisstore.ReplicaStats{Shortfalls: 6}, s.ReplicaStats(), "the fresh claims, each counted once")
}

// TestReplicaShortfallLoggedByDefault: without Options.OnReplicaShortfall,
// a shortfall is logged by log/slog's default logger, at Warn level, with
// its operation, key and replica count. Not parallel: it sets that logger.
func TestReplicaShortfallLoggedByDefault(t *testing.T) {
	master, replica := startReplicated(t)
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: master.Addr})
	t.Cleanup(func() { _ = client.Close() })
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	req := claimReq(time.Minute, nil)
	_, err = s.Claim(ctx, "k", req)
	require.NoError(t, err)
	before := s.ReplicaStats().Shortfalls // the claim's WAIT may time out on a loaded machine
	replica.Stop()
	require.NoError(t, s.Complete(ctx, "k", req.Token, []byte("r"), time.Hour))
	assert.Equal(t, before+1, s.ReplicaStats().Shortfalls, "the complete's shortfall")
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, buf.String(), "level=WARN")
	assert.Contains(t, buf.String(), `a failover now may lose it" op=complete idempotency_key=k replicas_acked=0`)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
