package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

func TestConformanceStandalone(t *testing.T) {
	client := testserver.RedisClient(t)
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s, err := redisstore.New(client)
		require.NoError(t, err)
		return storetest.Subject{Store: s}
	})
}

func TestConformanceCluster(t *testing.T) {
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s, err := redisstore.New(client)
		require.NoError(t, err)
		return storetest.Subject{Store: s}
	})
}

func TestConformanceUniversalClient(t *testing.T) {
	client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{testserver.RedisAddr(t)}})
	t.Cleanup(func() { _ = client.Close() })
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		s, err := redisstore.New(client)
		require.NoError(t, err)
		return storetest.Subject{Store: s}
	})
}

func TestNilClient(t *testing.T) {
	_, err := redisstore.New(nil)
	assert.ErrorIs(t, err, redisstore.ErrNilClient)
	var typedNil *redis.Client
	_, err = redisstore.New(typedNil)
	assert.ErrorIs(t, err, redisstore.ErrNilClient)
	_, err = redisstore.NewExpiringKeyRepository(nil, "p:", time.Minute)
	assert.ErrorIs(t, err, redisstore.ErrNilClient)
}

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

// countingHook counts the commands the client sends, pipelines included.
type countingHook struct{ sent *int }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { *h.sent++; return next(ctx, cmd) }
}
func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { *h.sent += len(cmds); return next(ctx, cmds) }
}

// TestOneCommandPerTransition proves, from the server's own statistics, that
// each transition is one command: one EVALSHA, nothing else from the client.
func TestOneCommandPerTransition(t *testing.T) {
	srv := testserver.StartRedis(t) // private: the statistics are ours alone
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = client.Close() })
	var sent int
	client.AddHook(countingHook{sent: &sent})
	s, err := redisstore.New(client)
	require.NoError(t, err)
	ctx := context.Background()

	// Warm up: the first call of each script loads it (NOSCRIPT, then EVAL).
	warm, err := s.Claim(ctx, "warm", time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, s.Renew(ctx, "warm", warm.Token, time.Minute))
	require.NoError(t, s.Fail(ctx, "warm", warm.Token, time.Minute))

	var token string
	steps := []struct {
		name string
		run  func() error
	}{
		{"claim", func() error {
			res, err := s.Claim(ctx, "k", time.Minute, []byte("fp"))
			token = res.Token
			return err
		}},
		{"renew", func() error { return s.Renew(ctx, "k", token, time.Minute) }},
		{"complete", func() error { return s.Complete(ctx, "k", token, []byte("result"), time.Hour) }},
		{"duplicate claim", func() error {
			res, err := s.Claim(ctx, "k", time.Minute, nil)
			if err == nil && (res.Acquired || string(res.Record.Result) != "result") {
				t.Errorf("duplicate claim: %+v", res)
			}
			return err
		}},
		{"claim again", func() error {
			res, err := s.Claim(ctx, "k2", time.Minute, nil)
			token = res.Token
			return err
		}},
		{"fail", func() error { return s.Fail(ctx, "k2", token, time.Hour) }},
	}
	for _, step := range steps {
		require.NoError(t, admin.ConfigResetStat(ctx).Err())
		sent = 0
		require.NoError(t, step.run(), step.name)
		calls := commandCalls(t, admin)
		assert.Equal(t, 1, sent, "%s: commands sent by the client", step.name)
		assert.Equal(t, 1, calls["evalsha"], "%s: EVALSHA calls on the server, stats %v", step.name, calls)
		// The commands a script runs inside Redis are listed in commandstats
		// too, so "nothing else" is proven by the client's own count above;
		// here: the script ran by SHA, never re-sent or re-loaded.
		assert.Zero(t, calls["eval"]+calls["script|load"], "%s: script re-sent, stats %v", step.name, calls)
	}
}

func TestStoreDownIsAnError(t *testing.T) {
	srv := testserver.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client)
	require.NoError(t, err)
	srv.Stop()
	_, err = s.Claim(context.Background(), "k", time.Second, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "redisstore: claim")
	assert.NotErrorIs(t, err, middleware.ErrLeaseLost)
	srv.Start()
	res, err := s.Claim(context.Background(), "k", time.Second, nil)
	require.NoError(t, err, "the store works again once Redis is back")
	assert.True(t, res.Acquired)
}
