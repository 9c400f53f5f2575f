package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestPlainClaimRefusedFallsBackToTheScript: a server that answers the
// fresh claim's SET with a syntax error, as Redis 5 and 6 answer SET NX GET
// (here Redis 7, made to refuse it by one more option), has the claim run
// by claim.lua instead, and every later claim of the store too: no claim
// fails, and the key is claimed once.
func TestPlainClaimRefusedFallsBackToTheScript(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin, client, _ := statClients(t, srv.Addr)
	s, err := redisstore.New(client)
	require.NoError(t, err)
	redisstore.AddFreshClaimArgs(s, "xx") // SET NX XX: "ERR syntax error"
	ctx := context.Background()

	req := claimReq(time.Minute, []byte("fp"))
	res, err := s.Claim(ctx, "k", req)
	require.NoError(t, err, "the refused SET is not the claim's answer")
	assert.True(t, res.Acquired)
	assert.True(t, redisstore.ClaimsWithScriptOnly(s), "the store went over to claim.lua")
	raw, err := admin.Get(ctx, "k").Bytes()
	require.NoError(t, err)
	assert.Equal(t, byte('P'), raw[1], "claim.lua's P record, with the server's times")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, res.Record, rec)

	calls := commandCalls(t, admin)
	require.NoError(t, admin.ConfigResetStat(ctx).Err())
	other, err := s.Claim(ctx, "k", claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.False(t, other.Acquired, "the key is claimed once")
	second, err := s.Claim(ctx, "k2", claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.True(t, second.Acquired)
	after := commandCalls(t, admin)
	assert.Equal(t, 2, after["evalsha"], "later claims go straight to claim.lua, stats before %v, after %v", calls, after)
	assert.Equal(t, 2, after["set"], "no plain SET before them (claim.lua's own SET NX GET, once per claim), stats %v", after)
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
