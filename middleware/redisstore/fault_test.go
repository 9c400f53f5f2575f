package redisstore_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// lostReplies is a store whose client talks to a private Redis through a
// proxy that can drop a reply after its command ran; the client keeps
// go-redis's default MaxRetries (3), so it resends the command.
type lostReplies struct {
	proxy *testserver.Proxy
	store *redisstore.Store
	// direct bypasses the proxy, to look at what the resend left.
	direct *redisstore.Store
	client *redis.Client
}

func newLostReplies(t *testing.T) *lostReplies {
	srv := testserver.StartRedis(t)
	proxy := testserver.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: proxy.Addr})
	t.Cleanup(func() { _ = client.Close() })
	direct := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	l := &lostReplies{proxy: proxy, client: client}
	var err error
	l.store, err = redisstore.New(client, nil)
	require.NoError(t, err)
	l.direct, err = redisstore.New(direct, nil)
	require.NoError(t, err)

	// Load every script, so that the dropped reply is the script's own and
	// not a NOSCRIPT answer.
	loadScripts(t, l.store)
	return l
}

// dropNext arms the proxy for the next script call on key.
func (l *lostReplies) dropNext(key string) { l.proxy.DropReply(testserver.Command("evalsha", key)) }

// resent claims key, drops the reply of the next script call on it and
// makes that call with the claim's token: go-redis resends it, and the
// resend must succeed as the first try did. It returns the token and the
// record the resend left, read past the proxy.
func (l *lostReplies) resent(t *testing.T, key string, call func(ctx context.Context, token string) error, msg string) (string, idempotency.Record) {
	t.Helper()
	ctx := context.Background()
	req := claimReq(time.Minute, nil)
	_, err := l.store.Claim(ctx, key, req)
	require.NoError(t, err)
	dropped := l.proxy.Dropped()
	l.dropNext(key)
	require.NoError(t, call(ctx, req.Token), msg)
	require.Equal(t, dropped+1, l.proxy.Dropped(), "the first reply was dropped")
	rec, err := l.direct.Get(ctx, key)
	require.NoError(t, err)
	return req.Token, rec
}

// TestLostReplies drops the reply of each transition after Redis applied
// it: go-redis resends the same command, and the resend must answer what
// the first try would have. Before the fix a resent claim was refused as
// IN_PROGRESS (a stall until the lease ended), and a resent Complete or Fail
// answered ErrLeaseLost.
func TestLostReplies(t *testing.T) {
	l := newLostReplies(t)
	ctx := context.Background()

	// A fresh claim is a plain SET, and claim.lua for a key the SET leaves.
	scriptOnly, err := redisstore.New(l.client, nil)
	require.NoError(t, err)
	redisstore.ClaimWithScriptOnly(scriptOnly)
	for _, c := range []struct {
		name, command string
		store         *redisstore.Store
	}{{"claim", "set", l.store}, {"claim script", "evalsha", scriptOnly}} {
		t.Run(c.name, func(t *testing.T) {
			key := c.name
			req := claimReq(time.Minute, []byte("fp"))
			dropped := l.proxy.Dropped()
			l.proxy.DropReply(testserver.Command(c.command, key))
			res, err := c.store.Claim(ctx, key, req)
			require.NoError(t, err)
			require.Equal(t, dropped+1, l.proxy.Dropped(), "the first reply was dropped")
			assert.True(t, res.Acquired, "the resent claim acquires: no stall behind its own first try")
			assert.Equal(t, 1, res.Record.Attempts, "and counts no second attempt")
			assert.Equal(t, req.Token, res.Record.Token)
			require.NoError(t, l.store.Complete(ctx, key, req.Token, []byte("r"), time.Minute), "the claimer owns the key")
		})
	}

	t.Run("renew", func(t *testing.T) {
		token, rec := l.resent(t, "renew", func(ctx context.Context, token string) error {
			return l.store.Renew(ctx, "renew", token, 2*time.Minute)
		}, "no false lease loss")
		assert.Equal(t, idempotency.StateInProgress, rec.State)
		assert.Equal(t, token, rec.Token)
	})

	t.Run("complete", func(t *testing.T) {
		_, rec := l.resent(t, "complete", func(ctx context.Context, token string) error {
			return l.store.Complete(ctx, "complete", token, []byte("result"), time.Minute)
		}, "the resent Complete succeeds: no false lease loss")
		assert.Equal(t, idempotency.StateCompleted, rec.State)
		assert.Equal(t, []byte("result"), rec.Result)
	})

	t.Run("fail", func(t *testing.T) {
		_, rec := l.resent(t, "fail", func(ctx context.Context, token string) error {
			return l.store.Fail(ctx, "fail", token, time.Minute)
		}, "the resent Fail succeeds: no false lease loss")
		assert.Equal(t, idempotency.StateFailed, rec.State)
		assert.Equal(t, 1, rec.Attempts)
	})

	t.Run("release", func(t *testing.T) {
		first := claimReq(time.Minute, nil)
		_, err := l.store.Claim(ctx, "release", first)
		require.NoError(t, err)
		require.NoError(t, l.store.Fail(ctx, "release", first.Token, time.Minute))
		_, rec := l.resent(t, "release", func(ctx context.Context, token string) error {
			return l.store.Release(ctx, "release", token)
		}, "the resent Release succeeds")
		assert.Equal(t, idempotency.StateFailed, rec.State)
		assert.Equal(t, 1, rec.Attempts, "the resend undid nothing a second time")
	})

	t.Run("repository", func(t *testing.T) {
		repo, err := redisstore.NewExpiringKeyRepository(l.client, "dedup:", time.Minute)
		require.NoError(t, err)
		dropped := l.proxy.Dropped()
		l.proxy.DropReply(testserver.Command("set", "dedup:msg"))
		dup, err := repo.IsDuplicate(ctx, "msg")
		require.NoError(t, err)
		require.Equal(t, dropped+1, l.proxy.Dropped())
		assert.False(t, dup, "a message whose mark was set by its own lost first try is not a duplicate")
		dup, err = repo.IsDuplicate(ctx, "msg")
		require.NoError(t, err)
		assert.True(t, dup, "the next call with the key is a duplicate")
	})

	// Without a resend the call fails and the message is nacked: its
	// redelivery must not find the mark of the call that failed.
	t.Run("repository without resend", func(t *testing.T) {
		client := redis.NewClient(&redis.Options{Addr: l.proxy.Addr, MaxRetries: -1})
		t.Cleanup(func() { _ = client.Close() })
		repo, err := redisstore.NewExpiringKeyRepository(client, "dedup:", time.Minute)
		require.NoError(t, err)
		dropped := l.proxy.Dropped()
		l.proxy.DropReply(testserver.Command("set", "dedup:unanswered"))
		_, err = repo.IsDuplicate(ctx, "unanswered")
		require.Error(t, err, "no answer: the Deduplicator nacks")
		require.Equal(t, dropped+1, l.proxy.Dropped())
		dup, err := repo.IsDuplicate(ctx, "unanswered")
		require.NoError(t, err)
		assert.False(t, dup, "the redelivery is not a duplicate of the call that failed")
		dup, err = repo.IsDuplicate(ctx, "unanswered")
		require.NoError(t, err)
		assert.True(t, dup)
	})
}

// TestDeadlineBoundsACall freezes a private Redis with DEBUG SLEEP (sent
// from another connection) and claims with a 100 ms deadline: with
// ContextTimeoutEnabled, which New requires, the claim returns an error
// matching context.DeadlineExceeded instead of waiting for the server, so a
// store call never outlives the lease it runs under. go-redis reports the
// deadline as context.DeadlineExceeded only when it would retry (its backoff
// sleep sees the context done); without retries it is the socket's "i/o
// timeout", which the store must translate. A client without the option is
// shown waiting out the same freeze past its deadline.
func TestDeadlineBoundsACall(t *testing.T) {
	srv := testserver.StartRedis(t, "--enable-debug-command", "yes")
	ctx := context.Background()
	for name, retries := range map[string]int{"default retries": 0, "no retries": -1} {
		t.Run(name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, MaxRetries: retries})
			t.Cleanup(func() { _ = client.Close() })
			s, err := redisstore.New(client, nil)
			require.NoError(t, err)
			warm := claimReq(time.Minute, nil)
			_, err = s.Claim(ctx, "warm", warm) // loads the script: the frozen call is one EVALSHA
			require.NoError(t, err)

			key := "frozen:" + name
			req := claimReq(time.Minute, nil)
			freeze(t, srv.Addr, func() {
				ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				_, err := s.Claim(ctx, key, req)
				require.Error(t, err)
				t.Log(err)
				assert.ErrorIs(t, err, context.DeadlineExceeded, "the claim gives up at its deadline")
				assert.Contains(t, err.Error(), `redisstore: claim "`+key+`"`)
			})
			// The EVALSHA may have run once the server woke; its owner never
			// learned the outcome, which is what Release is for.
			require.NoError(t, s.Release(ctx, key, req.Token))
			rec, err := s.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateAbsent, rec.State, "a claim whose outcome was never learned is released")
		})
	}

	// What New refuses: a client without the option does the same kind of
	// call under context.Background() and returns after its deadline.
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = plain.Close() })
	_, err := redisstore.New(plain, nil)
	require.ErrorIs(t, err, redisstore.ErrContextTimeoutDisabled)
	freeze(t, srv.Addr, func() {
		ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		assert.NoError(t, plain.Ping(ctx).Err(), "the reply is awaited past the deadline")
		assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "the call returned after its deadline")
	})
}

// freeze runs fn while the Redis at addr sleeps in DEBUG SLEEP 1, sent from
// a connection of its own, and waits for the server to wake.
func freeze(t *testing.T, addr string, fn func()) {
	t.Helper()
	sleeper := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 5 * time.Second, MaxRetries: -1})
	defer func() { _ = sleeper.Close() }()
	probe := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, MaxRetries: -1})
	defer func() { _ = probe.Close() }()
	require.NoError(t, probe.Ping(context.Background()).Err())
	require.NoError(t, sleeper.Ping(context.Background()).Err())

	slept := make(chan error, 1)
	go func() { slept <- sleeper.Do(context.Background(), "debug", "sleep", "1").Err() }()
	// The server is frozen once a PING no longer answers within 20 ms; the
	// sleeper's command may take a while to be sent on a loaded machine.
	frozen := false
	for start := time.Now(); !frozen && time.Since(start) < 3*time.Second; {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := probe.Ping(ctx).Err()
		cancel()
		if errors.Is(err, os.ErrDeadlineExceeded) { // go-redis's own form of the deadline
			frozen = true
			break
		}
		require.NoError(t, err)
		select {
		case err := <-slept:
			require.Failf(t, "DEBUG SLEEP ended before a PING saw the server frozen", "%v", err)
		default:
		}
	}
	require.True(t, frozen, "DEBUG SLEEP did not freeze the server")
	fn()
	require.NoError(t, <-slept, "DEBUG SLEEP")
}
