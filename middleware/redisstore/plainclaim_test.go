package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestClaimBefore7IsRefused: a server that answers the fresh claim's SET
// with a syntax error, as Redis before 7.0 answers SET NX GET (here Redis
// 7, made to refuse it by one more option), fails the claim with an error
// that says Redis 7.0 or newer is required, on every path of the call, and
// every later claim too: nothing is written, no script runs.
func TestClaimBefore7IsRefused(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin, _, _ := statClients(t, srv.Addr)
	ctx := context.Background()
	for name, opts := range map[string]redisstore.Options{
		"auto-pipelined":          {},
		"on its own":              {DisableAutoPipelining: true},
		"replica acknowledgement": {Replicas: 1, ReplicaTimeout: 10 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
			t.Cleanup(func() { _ = client.Close() })
			s, err := redisstore.New(client, &opts)
			require.NoError(t, err)
			redisstore.AddFreshClaimArgs(s, "xx") // SET NX XX: "ERR syntax error"
			require.NoError(t, admin.ConfigResetStat(ctx).Err())
			n := writes(t, admin)
			for i := range 2 {
				key := "before7:" + name + ":" + strconv.Itoa(i)
				_, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
				require.Error(t, err)
				assert.ErrorContains(t, err, "redisstore: claim \""+key+"\": the server must be Redis 7.0 or newer")
				assert.ErrorContains(t, err, "ERR syntax error", "the server's reply is kept")
				assert.Zero(t, dump(t, admin, key), "nothing written")
			}
			assert.Equal(t, n, writes(t, admin), "nothing written")
			calls := commandCalls(t, admin)
			assert.Zero(t, calls["evalsha"]+calls["eval"], "no claim went on to claim.lua: %v", calls)
		})
	}
}

// TestPlainClaimTimesBracketTheSend: the times a plain claim reports are
// this host's clock when it sent the SET, and the ones the record keeps
// (Get) are the server's when it ran it, on the same host here: the
// reported lease ends no later than the kept one, and no earlier than the
// kept one less the call's duration. A lease counted on the client's side
// never outlasts the server's.
func TestPlainClaimTimesBracketTheSend(t *testing.T) {
	s, _, prefix := newStore(t)
	ctx := context.Background()
	for i := range 20 {
		key := prefix + "bracket:" + string(rune('a'+i))
		req := claimReq(time.Minute, nil)
		before := time.Now()
		res, err := s.Claim(ctx, key, req)
		took := time.Since(before)
		require.NoError(t, err)
		require.True(t, res.Acquired)
		sent := res.Record.CreatedAt // the client's clock when the store sent the SET, after before
		assert.False(t, sent.Before(before.Truncate(time.Millisecond)), "the send's time, to the millisecond: %v, called at %v", sent, before)
		assert.False(t, sent.After(before.Add(took)), "the send's time, within the call: %v, called at %v for %v", sent, before, took)
		assert.Equal(t, sent, sent.Truncate(time.Millisecond), "to the millisecond")
		assert.Equal(t, res.Record.CreatedAt.Add(time.Minute), res.Record.LeaseExpiresAt)
		kept, err := s.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateInProgress, kept.State)
		assert.False(t, kept.LeaseExpiresAt.Before(res.Record.LeaseExpiresAt), "the kept lease ends no earlier than the reported one")
		assert.False(t, kept.LeaseExpiresAt.After(res.Record.LeaseExpiresAt.Add(took+time.Millisecond)),
			"and no later than the call's %v after it", took)
		assert.Equal(t, kept.LeaseExpiresAt.Add(-time.Minute), kept.CreatedAt)
	}
}
