package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

func TestNilClient(t *testing.T) {
	_, err := redisstore.New(nil, nil)
	assert.ErrorIs(t, err, redisstore.ErrNilClient)
	var typedNil *redis.Client
	_, err = redisstore.New(typedNil, nil)
	assert.ErrorIs(t, err, redisstore.ErrNilClient)
	_, err = redisstore.NewExpiringKeyRepository(nil, "p:", time.Minute)
	assert.ErrorIs(t, err, redisstore.ErrNilClient)
}

// TestContextTimeoutRequired: New refuses every client kind whose options
// leave ContextTimeoutEnabled false, since go-redis then does its socket I/O
// under context.Background() and no store call could be bounded by its
// owner's lease; the same kinds with the option are accepted. Nothing here
// contacts a server.
func TestContextTimeoutRequired(t *testing.T) {
	const addr = "127.0.0.1:1" // never dialled
	clients := map[string]func(enabled bool) redis.UniversalClient{
		"client": func(on bool) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: on})
		},
		"failover": func(on bool) redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}, ContextTimeoutEnabled: on})
		},
		"cluster": func(on bool) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: on})
		},
		"ring": func(on bool) redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: on})
		},
		"universal simple": func(on bool) redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, ContextTimeoutEnabled: on})
		},
		"universal cluster": func(on bool) redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr, addr}, ContextTimeoutEnabled: on})
		},
		"universal failover": func(on bool) redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, MasterName: "m", ContextTimeoutEnabled: on})
		},
	}
	for name, newClient := range clients {
		t.Run(name, func(t *testing.T) {
			off := newClient(false)
			t.Cleanup(func() { _ = off.Close() })
			s, err := redisstore.New(off, nil)
			assert.ErrorIs(t, err, redisstore.ErrContextTimeoutDisabled)
			assert.Nil(t, s)
			repo, err := redisstore.NewExpiringKeyRepository(off, "p:", time.Minute)
			assert.NoError(t, err, "the repository holds no lease, so it takes the client as it is")
			assert.NotNil(t, repo)

			on := newClient(true)
			t.Cleanup(func() { _ = on.Close() })
			s, err = redisstore.New(on, nil)
			assert.NoError(t, err)
			assert.NotNil(t, s)
		})
	}

	// A ReadTimeout or WriteTimeout of -2 turns socket deadlines off,
	// the context's included.
	for _, opts := range []*redis.Options{
		{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: -2},
		{Addr: addr, ContextTimeoutEnabled: true, WriteTimeout: -2},
	} {
		c := redis.NewClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		_, err := redisstore.New(c, nil)
		assert.ErrorIs(t, err, redisstore.ErrContextTimeoutDisabled, "read %v write %v", opts.ReadTimeout, opts.WriteTimeout)
	}

	// A UniversalClient of another type hides its options: it is taken as
	// it is, as New documents.
	inner := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = inner.Close() })
	s, err := redisstore.New(wrapped{inner}, nil)
	assert.NoError(t, err)
	assert.NotNil(t, s)
}

// wrapped is a UniversalClient that is none of go-redis's own types.
type wrapped struct{ *redis.Client }

// commandCalls reads INFO commandstats into command → calls.
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(v)
			}
		}
	}
	return calls
}

// roundTrips counts what a client sends: round trips (a command, or a whole
// pipeline) and commands. With only set, it counts just those commands, and
// a round trip only when it carries one of them; a new connection's
// handshake (HELLO) is never counted.
type roundTrips struct {
	only        map[string]bool
	mu          sync.Mutex
	trips, cmds int
}

func (h *roundTrips) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips, h.cmds = 0, 0
}

func (h *roundTrips) counts() (trips, cmds int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.trips, h.cmds
}

func (h *roundTrips) count(cmds ...redis.Cmder) {
	n := 0
	for _, c := range cmds {
		if c.Name() != "hello" && (h.only == nil || h.only[c.Name()]) {
			n++
		}
	}
	if n > 0 {
		h.mu.Lock()
		h.trips++
		h.cmds += n
		h.mu.Unlock()
	}
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds...)
		return next(ctx, cmds)
	}
}

// TestOneCommandPerTransition proves, from the server's own statistics, that
// each transition is one command: one EVALSHA, or the plain claim's SET,
// nothing else from the client; a claim of a key in another state than
// absent or COMPLETED is the SET and then claim.lua.
func TestOneCommandPerTransition(t *testing.T) {
	srv := testserver.StartRedis(t) // private: the statistics are ours alone
	admin, client, hook := statClients(t, srv.Addr)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()

	// Warm up: the first call of each script loads it (NOSCRIPT, then EVAL).
	loadScripts(t, s)
	require.NoError(t, admin.RPush(ctx, "corrupt", "x").Err())

	var token string
	steps := []struct {
		name string
		run  func() error
	}{
		{"claim", claimStep(s, "k", []byte("fp"), &token)},
		{"renew", func() error { return s.Renew(ctx, "k", token, time.Minute) }},
		{"complete", func() error { return s.Complete(ctx, "k", token, []byte("result"), time.Hour) }},
		{"complete resent", func() error { return s.Complete(ctx, "k", token, []byte("result"), time.Hour) }},
		{"duplicate claim", func() error {
			res, err := s.Claim(ctx, "k", claimReq(time.Minute, nil))
			if err == nil && (res.Acquired || string(res.Record.Result) != "result") {
				t.Errorf("duplicate claim: %+v", res)
			}
			return err
		}},
		{"get", func() error { _, err := s.Get(ctx, "k"); return err }},
		{"claim again", claimStep(s, "k2", nil, &token)},
		// A key the plain claim does not settle: its SET answers with the
		// record, and claim.lua decides. Two commands.
		{"claim resent", func() error {
			res, err := s.Claim(ctx, "k2", idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
			if err == nil && !res.Acquired {
				t.Errorf("resent claim refused: %+v", res)
			}
			return err
		}},
		{"fail", func() error { return s.Fail(ctx, "k2", token, time.Hour) }},
		{"fail resent", func() error { return s.Fail(ctx, "k2", token, time.Hour) }},
		{"claim to release", claimStep(s, "k2", nil, &token)},
		{"release", func() error { return s.Release(ctx, "k2", token) }},
		{"release resent", func() error { return s.Release(ctx, "k2", token) }},
		// A corrupt record is an error reply of the script, which go-redis
		// must not retry: still one EVALSHA.
		{"corrupt", func() error {
			_, err := s.Get(ctx, "corrupt")
			if !errors.Is(err, idempotency.ErrCorruptRecord) {
				return fmt.Errorf("want ErrCorruptRecord, got %v", err)
			}
			return nil
		}},
	}
	for _, step := range steps {
		// The commands a script runs inside Redis are listed in commandstats
		// too, so "nothing else" is proven by the client's own count;
		// scriptStep checks that the script ran by SHA, never re-sent or
		// re-loaded.
		_, cmds, _ := scriptStep(t, admin, hook, step.name, step.run)
		want := 1
		if step.name == "claim resent" || step.name == "claim to release" {
			want = 2
		}
		assert.Equal(t, want, cmds, "%s: commands sent by the client", step.name)
	}
}

// statClients are two clients of the Redis at addr: admin, to read and
// reset the server's command statistics, and client, for the store, whose
// commands hook counts. client speaks RESP2 without CLIENT SETINFO, so
// that it sends nothing of its own beside the store's commands.
func statClients(t *testing.T, addr string) (admin, client *redis.Client, hook *roundTrips) {
	admin = redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	client = redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = client.Close() })
	hook = &roundTrips{}
	client.AddHook(hook)
	return admin, client, hook
}

// scriptStep runs one step with the server's command statistics and the
// client's counts reset, checks that the server ran one script, by its
// SHA, and returns the round trips and commands the client sent and the
// server's calls per command.
func scriptStep(t *testing.T, admin *redis.Client, hook *roundTrips, name string, run func() error) (trips, cmds int, calls map[string]int) {
	t.Helper()
	require.NoError(t, admin.ConfigResetStat(context.Background()).Err())
	hook.reset()
	require.NoError(t, run(), name)
	trips, cmds = hook.counts()
	calls = commandCalls(t, admin)
	if plainStep(name) {
		assert.Equal(t, 1, calls["set"], "%s: the plain claim's SET, stats %v", name, calls)
		assert.Zero(t, calls["evalsha"], "%s: no script, stats %v", name, calls)
	} else {
		assert.Equal(t, 1, calls["evalsha"], "%s: EVALSHA calls on the server, stats %v", name, calls)
	}
	assert.Zero(t, calls["eval"]+calls["script|load"], "%s: script re-sent, stats %v", name, calls)
	return trips, cmds, calls
}

// plainStep reports the steps of the transition tests that are a claim of
// an absent or COMPLETED key: one plain SET NX PX GET, no script.
func plainStep(name string) bool {
	switch name {
	case "claim", "duplicate claim", "claim again":
		return true
	}
	return false
}

func TestStoreDownIsAnError(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	srv.Stop()
	_, err = s.Claim(context.Background(), "k", claimReq(time.Second, nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redisstore: claim")
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	srv.Start()
	res, err := s.Claim(context.Background(), "k", claimReq(time.Second, nil))
	require.NoError(t, err, "the store works again once Redis is back")
	assert.True(t, res.Acquired)
}

// loadScripts calls every script of s once, on the keys "warm" and
// "warm2", so that Redis knows them all: the first call of a script is
// answered NOSCRIPT and sent again with EVAL.
func loadScripts(t *testing.T, s *redisstore.Store) {
	t.Helper()
	ctx := context.Background()
	req := claimReq(time.Minute, nil)
	_, err := s.Claim(ctx, "warm", req)
	require.NoError(t, err)
	_, err = s.Claim(ctx, "warm", req) // a key the plain claim leaves to claim.lua
	require.NoError(t, err)
	require.NoError(t, s.Renew(ctx, "warm", req.Token, time.Minute))
	require.NoError(t, s.Complete(ctx, "warm", req.Token, nil, time.Minute))
	_, err = s.Get(ctx, "warm")
	require.NoError(t, err)
	req = claimReq(time.Minute, nil)
	_, err = s.Claim(ctx, "warm2", req)
	require.NoError(t, err)
	require.NoError(t, s.Fail(ctx, "warm2", req.Token, time.Minute))
	require.NoError(t, s.Release(ctx, "warm2", req.Token))
}

// claimStep is a step that claims key on s with a fresh token, kept in
// *token for the steps after it.
func claimStep(s *redisstore.Store, key string, fp []byte, token *string) func() error {
	return func() error {
		req := claimReq(time.Minute, fp)
		*token = req.Token
		_, err := s.Claim(context.Background(), key, req)
		return err
	}
}

// claimReq is a claim with a fresh token, the given lease and fingerprint,
// and a TTL of one minute.
func claimReq(lease time.Duration, fp []byte) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: lease, TTL: time.Minute, Fingerprint: fp}
}
