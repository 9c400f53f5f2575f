package testserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

func uniqueKey(t *testing.T) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "proxy-test:" + t.Name() + ":" + hex.EncodeToString(b)
}

// TestProxyForwards: everything goes through unchanged, RESP2 and RESP3,
// pipelines and values larger than any buffer.
func TestProxyForwards(t *testing.T) {
	p := testserver.StartProxy(t, testserver.RedisAddr(t))
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		c := redis.NewClient(&redis.Options{Addr: p.Addr, Protocol: protocol})
		t.Cleanup(func() { _ = c.Close() })
		k := uniqueKey(t)
		t.Cleanup(func() { _ = c.Del(ctx, k, k+":h").Err() })

		big := make([]byte, 1<<20)
		_, _ = rand.Read(big)
		require.NoError(t, c.Set(ctx, k, big, 0).Err())
		got, err := c.Get(ctx, k).Bytes()
		require.NoError(t, err)
		assert.True(t, bytes.Equal(big, got), "protocol %d: 1 MiB value round trip", protocol)

		require.NoError(t, c.HSet(ctx, k+":h", "a", "1", "b", "\r\n").Err())
		m, err := c.HGetAll(ctx, k+":h").Result() // a map in RESP3
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"a": "1", "b": "\r\n"}, m, "protocol %d", protocol)

		cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for range 100 {
				pipe.Incr(ctx, k+":n")
			}
			return nil
		})
		require.NoError(t, err)
		assert.EqualValues(t, 100, cmds[99].(*redis.IntCmd).Val(), "protocol %d: pipelined replies in order", protocol)
		require.NoError(t, c.Del(ctx, k+":n").Err())
	}
	assert.Zero(t, p.Dropped())
}

// TestProxyDropReply: an armed command runs on Redis, its reply is lost, and
// go-redis resends it on a new connection: INCR then runs twice.
func TestProxyDropReply(t *testing.T) {
	p := testserver.StartProxy(t, testserver.RedisAddr(t))
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { _ = c.Close() })
	k := uniqueKey(t)
	t.Cleanup(func() { _ = c.Del(ctx, k).Err() })

	require.NoError(t, c.Ping(ctx).Err())
	p.DropReply(testserver.Command("INCR", k))
	require.NoError(t, c.Incr(ctx, k+":other").Err(), "a command that does not match goes through")
	require.NoError(t, c.Del(ctx, k+":other").Err())
	n, err := c.Incr(ctx, k).Result()
	require.NoError(t, err, "go-redis resends after the lost reply")
	assert.EqualValues(t, 2, n, "the first INCR ran although its reply was lost")
	assert.Equal(t, 1, p.Dropped())

	n, err = c.Incr(ctx, k).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 3, n, "one drop per arming")
	assert.Equal(t, 1, p.Dropped())
}

// TestProxyDropReplyWithoutRetries: a client that does not resend sees the
// closed connection, yet the command ran.
func TestProxyDropReplyWithoutRetries(t *testing.T) {
	p := testserver.StartProxy(t, testserver.RedisAddr(t))
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	k := uniqueKey(t)
	t.Cleanup(func() { _ = c.Del(ctx, k).Err() })

	p.DropReply(testserver.Command("SET", k))
	err := c.Set(ctx, k, "v", 0).Err()
	assert.ErrorIs(t, err, io.EOF, "the client reads a clean EOF, which go-redis retries when allowed")
	assert.Equal(t, 1, p.Dropped())
	v, err := c.Get(ctx, k).Result()
	require.NoError(t, err)
	assert.Equal(t, "v", v, "the command ran although its reply was lost")
}
