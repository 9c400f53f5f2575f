package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// The ceiling sends the commands the store sends, whatever they are (a
// plain SET claim, EVALSHA completes), by go-redis and by redis-benchmark,
// and leaves no key behind.
func TestCeilingMeasuresTheStoresCommands(t *testing.T) {
	addr := testserver.RedisAddr(t)
	o := options{redisAddr: addr, prefix: testserver.UniqueName("idembenchceil"), ceilingDur: 20 * time.Millisecond}
	rc := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr, PoolSize: 2 * ceilingClients})
	defer rc.Close()

	ce := runCeiling(o, rc)
	t.Logf("%+v", ce)
	sc, err := captureStore(context.Background(), addr, o.prefix+":check:")
	require.NoError(t, err)
	assert.Equal(t, commandNames(sc.claim, sc.complete), ce.Commands)
	assert.Equal(t, scriptSHA(sc.complete), ce.FinishSHA)
	assert.Positive(t, ce.GoClaims)
	assert.Positive(t, ce.GoMessages)
	assert.Positive(t, ce.MessageCeiling)
	if _, err := exec.LookPath("redis-benchmark"); err == nil {
		assert.Positive(t, ce.RedisBenchmarkClaims)
		assert.Positive(t, ce.RedisBenchmarkClaimsPipelined)
		assert.InDelta(t, ce.RedisBenchmarkClaims/float64(len(sc.claim)+len(sc.complete)), ce.MessageCeiling, 1e-9)
		assert.NotContains(t, ce.Note, "redis-benchmark -P", "redis-benchmark failed")
	}
	keys, err := rc.Keys(context.Background(), o.prefix+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys)
}

// redis-benchmark takes no NUL byte in an argument: the claim's NUL bytes
// go as 0x01, every length kept, the key replaced by a random one.
func TestRedisBenchmarkCommand(t *testing.T) {
	tmpl, err := newCmdTemplate([]any{"set", "k", []byte("a\x00b\x00"), "nx", "px", int64(5), "get"}, "k")
	require.NoError(t, err)
	args, note, err := redisBenchmarkCommand([]cmdTemplate{tmpl}, "p:")
	require.NoError(t, err)
	assert.Equal(t, []string{"set", "p:__rand_int__", "a\x01b\x01", "nx", "px", "5", "get"}, args)
	assert.Contains(t, note, "NUL")
	for _, a := range args {
		assert.False(t, strings.ContainsRune(a, 0))
	}
	_, _, err = redisBenchmarkCommand([]cmdTemplate{tmpl, tmpl}, "p:")
	assert.ErrorContains(t, err, "2 commands")
}
