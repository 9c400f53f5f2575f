package testserver_test

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
)

func faultClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startFaulty returns a fault proxy to the shared Redis, a client through
// it, and a key of the test's own, deleted when it ends.
func startFaulty(t *testing.T) (*testserver.FaultProxy, *redis.Client, string) {
	p := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	direct := testserver.RedisClient(t)
	k := uniqueKey(t)
	t.Cleanup(func() { _ = direct.Del(context.Background(), k).Err() })
	return p, faultClient(t, p.Addr), k
}

// TestFaultProxyForwards: bytes go through unchanged, values larger than
// any chunk included, and a latency delays each round trip by at least
// twice its value.
func TestFaultProxyForwards(t *testing.T) {
	t.Parallel()
	p, c, k := startFaulty(t)
	ctx := context.Background()

	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	require.NoError(t, c.Set(ctx, k, big, time.Minute).Err())
	got, err := c.Get(ctx, k).Bytes()
	require.NoError(t, err)
	assert.Equal(t, big, got)

	p.SetLatency(40 * time.Millisecond)
	start := time.Now()
	require.NoError(t, c.Ping(ctx).Err())
	assert.GreaterOrEqual(t, time.Since(start), 80*time.Millisecond, "one round trip crosses the delay twice")
	p.SetLatency(0)
	require.NoError(t, c.Ping(ctx).Err())
}

// TestFaultProxyStall: a stalled connection carries nothing (the call times
// out), and what it held is delivered once it resumes: the SET that timed
// out still runs, late.
func TestFaultProxyStall(t *testing.T) {
	t.Parallel()
	p, c, k := startFaulty(t)
	direct := testserver.RedisClient(t)
	ctx := context.Background()

	require.NoError(t, c.Ping(ctx).Err())
	require.Equal(t, 1, p.StallAll())
	sent := make(chan error, 1)
	go func() {
		// A client of its own, whose connection is opened after the stall
		// began: it is not stalled.
		fresh := faultClient(t, p.Addr)
		sent <- fresh.Ping(ctx).Err()
	}()
	require.NoError(t, <-sent, "a connection opened after StallAll carries traffic")

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := c.Set(short, k, "late", time.Minute).Err()
	cancel()
	require.Error(t, err)
	assert.True(t, errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded), "%v", err)
	n, err := direct.Exists(ctx, k).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing reached the server during the stall")

	p.ResumeAll()
	require.Eventually(t, func() bool { return direct.Exists(ctx, k).Val() == 1 }, 5*time.Second, 10*time.Millisecond,
		"the held command is delivered, late, when the stall ends")
}

// TestFaultProxyResetMidReply: the client gets half a reply and a reset.
func TestFaultProxyResetMidReply(t *testing.T) {
	t.Parallel()
	p, c, k := startFaulty(t)
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, k, "0123456789abcdef", time.Minute).Err())

	p.ResetMidReply()
	_, err := c.Get(ctx, k).Result()
	require.Error(t, err, "a reply cut in the middle is an error, not a value")
	assert.Equal(t, 1, p.Resets())
	v, err := c.Get(ctx, k).Result()
	require.NoError(t, err, "a new connection works")
	assert.Equal(t, "0123456789abcdef", v)
}

// TestFaultProxyPartition: during a partition, new connections carry
// nothing either; after Heal they do.
func TestFaultProxyPartition(t *testing.T) {
	t.Parallel()
	p := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
	c := faultClient(t, p.Addr)
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx).Err())

	p.Partition()
	for range 2 { // the second call dials again: still cut off
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		assert.Error(t, c.Ping(short).Err())
		cancel()
	}
	fresh := faultClient(t, p.Addr)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	assert.Error(t, fresh.Ping(short).Err(), "a connection opened during the partition carries nothing")
	cancel()

	p.Heal()
	require.NoError(t, c.Ping(ctx).Err())
	require.NoError(t, fresh.Ping(ctx).Err())
}
