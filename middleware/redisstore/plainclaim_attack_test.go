package redisstore_test

import (
	"context"
	"fmt"
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

// The tests of this file attack the plain claim (SET NX PX GET of an N
// record whose times come from the key's expiry) on private Redis servers:
// lost replies with other claimers in between, races of every claim path
// on one key, N records that lapse, whose expiry an operator moved, that a
// renewal, a resend, a Fail or a Complete rewrites, that a replica, a
// restart or a reload reads back, and their memory.

// TestPlainClaimLostReplyThenOtherClaimers: the plain claim's SET runs but
// its reply is lost, and the client does not resend it (MaxRetries -1), so
// the caller sees an error. Every other claimer, on every claim path, is
// refused meanwhile (exactly one owner, the one that does not know it);
// the owner's own resend acquires it as attempt 1 and completes it, or its
// Release frees the key for the next claimer, whose attempt is 1.
func TestPlainClaimLostReplyThenOtherClaimers(t *testing.T) {
	for _, mode := range []string{"auto-pipelined", "on its own"} {
		for _, then := range []string{"resend", "release"} {
			t.Run(mode+"/"+then, func(t *testing.T) {
				r := startCodecRedis(t)
				proxy := testserver.StartProxy(t, r.client.Options().Addr)
				client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: proxy.Addr, MaxRetries: -1})
				t.Cleanup(func() { _ = client.Close() })
				lossy, err := redisstore.New(client, &redisstore.Options{DisableAutoPipelining: mode == "on its own"})
				require.NoError(t, err)
				ctx := context.Background()

				key := "lost-then-others"
				req := claimReq(time.Minute, []byte("fp"))
				proxy.DropReply(testserver.Command("set", key))
				_, err = lossy.Claim(ctx, key, req)
				require.Error(t, err, "the reply was lost and not resent")
				require.Equal(t, 1, proxy.Dropped())
				kept, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				require.Equal(t, idempotency.StateInProgress, kept.State, "the SET ran")
				require.Equal(t, req.Token, kept.Token)

				var wg sync.WaitGroup
				results := make(chan idempotency.ClaimResult, 12)
				for range 4 {
					for path, s := range r.claimers() {
						wg.Go(func() {
							res, err := s.Claim(ctx, key, claimReq(time.Minute, []byte("fp")))
							assert.NoError(t, err, path)
							results <- res
						})
					}
				}
				wg.Wait()
				close(results)
				for res := range results {
					assert.False(t, res.Acquired, "the key has its one owner")
					assert.Equal(t, idempotency.StateInProgress, res.Record.State)
					assert.Empty(t, res.Record.Token, "a refusal shows no token")
				}

				switch then {
				case "resend":
					again, err := lossy.Claim(ctx, key, req)
					require.NoError(t, err)
					assert.True(t, again.Acquired, "the owner's resend acquires its own claim")
					assert.Equal(t, 1, again.Record.Attempts)
					assert.Equal(t, kept.CreatedAt, again.Record.CreatedAt, "the server's creation time, which the N record held")
					require.NoError(t, lossy.Complete(ctx, key, req.Token, []byte("out"), time.Hour))
					rec, err := r.store.Get(ctx, key)
					require.NoError(t, err)
					assert.Equal(t, idempotency.StateCompleted, rec.State)
					assert.Equal(t, 1, rec.Attempts)
					assert.Equal(t, kept.CreatedAt, rec.CreatedAt)
				case "release":
					require.NoError(t, lossy.Release(ctx, key, req.Token))
					next, err := r.store.Claim(ctx, key, claimReq(time.Minute, []byte("fp")))
					require.NoError(t, err)
					assert.True(t, next.Acquired, "the released key is free")
					assert.Equal(t, 1, next.Record.Attempts, "the lost claim counted no attempt")
				}
			})
		}
	}
}

// TestPlainClaimRaceAcrossPaths: claimers on every claim path (the plain
// SET and claim.lua) race for one
// fresh key, many times: exactly one acquires each key, and the key holds
// its token.
func TestPlainClaimRaceAcrossPaths(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	for round := range 40 {
		key := fmt.Sprintf("race:%d", round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var winners []string
		for i := range 3 {
			for path, s := range r.claimers() {
				wg.Go(func() {
					req := claimReq(time.Minute, nil)
					<-start
					res, err := s.Claim(ctx, key, req)
					if !assert.NoError(t, err, "%s %d", path, i) {
						return
					}
					if res.Acquired {
						mu.Lock()
						winners = append(winners, req.Token)
						mu.Unlock()
					}
				})
			}
		}
		close(start)
		wg.Wait()
		require.Len(t, winners, 1, "round %d: one owner", round)
		rec, err := r.store.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, winners[0], rec.Token)
		assert.Equal(t, 1, rec.Attempts)
	}
}

// TestPlainClaimLapsed: an N record whose lease lapsed reads FAILED with
// the lease's deadline; its owner is fenced by Renew, Complete and Fail
// (nothing written), its Release is a no-op, and the next claim, on every
// path, counts a second attempt of the same record, keeping its creation
// time.
func TestPlainClaimLapsed(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	const lease = 40 * time.Millisecond
	for path, s := range r.claimers() {
		t.Run(path, func(t *testing.T) {
			key := "lapsed:" + path
			req := claimReq(lease, []byte("fp"))
			res, err := r.store.Claim(ctx, key, req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			raw, err := r.client.Get(ctx, key).Bytes()
			require.NoError(t, err)
			require.Equal(t, byte('N'), raw[1], "the plain claim's N record")
			live, err := r.store.Get(ctx, key)
			require.NoError(t, err)
			time.Sleep(2 * lease)

			rec, err := r.store.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, idempotency.StateFailed, rec.State, "a lapsed lease reads FAILED")
			assert.Equal(t, live.LeaseExpiresAt, rec.LeaseExpiresAt, "with the lapsed deadline")
			assert.Equal(t, live.CreatedAt, rec.CreatedAt)
			assert.Equal(t, 1, rec.Attempts)
			untouched(t, r.client, key, func() {
				assert.ErrorIs(t, r.store.Renew(ctx, key, req.Token, time.Minute), idempotency.ErrLeaseLost)
				assert.ErrorIs(t, r.store.Complete(ctx, key, req.Token, []byte("late"), time.Hour), idempotency.ErrLeaseLost)
				assert.ErrorIs(t, r.store.Fail(ctx, key, req.Token, time.Hour), idempotency.ErrLeaseLost)
				assert.NoError(t, r.store.Release(ctx, key, req.Token), "a lapsed lease's Release undoes nothing")
			})

			next, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.True(t, next.Acquired)
			assert.Equal(t, 2, next.Record.Attempts, "the lapse counted an attempt")
			assert.Equal(t, live.CreatedAt, next.Record.CreatedAt, "of the same record")
			assert.Equal(t, []byte("fp"), next.Record.Fingerprint)
			assert.ErrorIs(t, r.store.Complete(ctx, key, req.Token, nil, time.Hour), idempotency.ErrLeaseLost, "the lapsed owner stays fenced")
		})
	}
}

// TestPlainClaimExpiryMoved: an N record's times are its key's expiry
// less the TTL and the lease, so an operator who moves that expiry moves
// them. One with no expiry (PERSIST), or whose expiry was moved later by
// more than the clock-step allowance (a minute) past the time it could
// have been set, is corrupt on every method and every claim path, nothing
// written, not IN_PROGRESS for as long as the new expiry says (a key
// claimed for a year: stalled until then). An expiry moved earlier ends
// the lease early: the record reads lapsed, and the next claim counts an
// attempt.
func TestPlainClaimExpiryMoved(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	moves := map[string]struct {
		move    func(key string) error
		corrupt bool
	}{
		"persisted":     {func(key string) error { return r.client.Persist(ctx, key).Err() }, true},
		"a year later":  {func(key string) error { return r.client.Expire(ctx, key, 365*24*time.Hour).Err() }, true},
		"an hour later": {func(key string) error { return r.client.Expire(ctx, key, 3*time.Hour).Err() }, true},
		"minutes later": {func(key string) error { return r.client.Expire(ctx, key, 2*time.Hour+5*time.Minute).Err() }, true},
		"earlier, the lease lapsed": {func(key string) error {
			return r.client.Expire(ctx, key, 2*time.Hour-time.Second).Err() // TTL 2h, lease 1 min
		}, false},
	}
	for name, m := range moves {
		t.Run(name, func(t *testing.T) {
			key := "moved:" + name
			req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: 2 * time.Hour}
			res, err := r.store.Claim(ctx, key, req)
			require.NoError(t, err)
			require.True(t, res.Acquired)
			require.NoError(t, m.move(key))
			if !m.corrupt {
				rec, err := r.store.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateFailed, rec.State, "the lease ended with the moved expiry")
				assert.ErrorIs(t, r.store.Complete(ctx, key, req.Token, nil, time.Hour), idempotency.ErrLeaseLost)
				next, err := r.store.Claim(ctx, key, claimReq(time.Minute, nil))
				require.NoError(t, err)
				assert.True(t, next.Acquired)
				assert.Equal(t, 2, next.Record.Attempts)
				return
			}
			untouched(t, r.client, key, func() {
				_, err := r.store.Get(ctx, key)
				corruptReason(t, err)
				for path, s := range r.claimers() {
					_, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
					corruptReason(t, err)
					_, err = s.Claim(ctx, key, req)
					assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "%s: the owner's resend", path)
				}
				assert.ErrorIs(t, r.store.Renew(ctx, key, req.Token, time.Minute), idempotency.ErrCorruptRecord)
				assert.ErrorIs(t, r.store.Complete(ctx, key, req.Token, nil, time.Hour), idempotency.ErrCorruptRecord)
				assert.ErrorIs(t, r.store.Fail(ctx, key, req.Token, time.Hour), idempotency.ErrCorruptRecord)
				assert.ErrorIs(t, r.store.Release(ctx, key, req.Token), idempotency.ErrCorruptRecord)
			})
			require.NoError(t, r.store.Delete(ctx, key))
			next, err := r.store.Claim(ctx, key, claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.True(t, next.Acquired, "Delete removes it")
		})
	}
}

// TestPlainClaimTransitionsKeepTheServerTimes: every transition of an N
// record (a renewal, the owner's resent claim, a Fail, a Complete) writes
// out the times the record held, read from its expiry: the created time
// Get read before it stays to the millisecond, the record becomes the P
// (or F, or COMPLETED) string, and the key's expiry is the transition's.
func TestPlainClaimTransitionsKeepTheServerTimes(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	claimN := func(t *testing.T, key string) (idempotency.ClaimRequest, idempotency.Record) {
		t.Helper()
		req := claimReq(time.Minute, []byte("fp"))
		res, err := r.store.Claim(ctx, key, req)
		require.NoError(t, err)
		require.True(t, res.Acquired)
		raw, err := r.client.Get(ctx, key).Bytes()
		require.NoError(t, err)
		require.Equal(t, byte('N'), raw[1])
		kept, err := r.store.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, kept.CreatedAt, kept.UpdatedAt)
		require.Equal(t, kept.CreatedAt.Add(time.Minute), kept.LeaseExpiresAt)
		time.Sleep(15 * time.Millisecond) // the transitions' clock is later than the claim's
		return req, kept
	}
	state := func(t *testing.T, key string) byte {
		raw, err := r.client.Get(ctx, key).Bytes()
		require.NoError(t, err)
		return raw[1]
	}

	t.Run("renew", func(t *testing.T) {
		req, kept := claimN(t, "times:renew")
		require.NoError(t, r.store.Renew(ctx, "times:renew", req.Token, 2*time.Hour))
		assert.Equal(t, byte('P'), state(t, "times:renew"))
		rec, err := r.store.Get(ctx, "times:renew")
		require.NoError(t, err)
		assert.Equal(t, kept.CreatedAt, rec.CreatedAt)
		assert.Equal(t, kept.UpdatedAt, rec.UpdatedAt, "a renewal is no new transition of the record's times")
		assert.WithinDuration(t, time.Now().Add(2*time.Hour), rec.LeaseExpiresAt, time.Second)
		pttl, err := r.client.PTTL(ctx, "times:renew").Result()
		require.NoError(t, err)
		assert.InDelta(t, float64(2*time.Hour+time.Minute), float64(pttl), float64(time.Second), "the lease and the claim's TTL")
		require.NoError(t, r.store.Complete(ctx, "times:renew", req.Token, []byte("out"), time.Hour))
		done, err := r.store.Get(ctx, "times:renew")
		require.NoError(t, err)
		assert.Equal(t, kept.CreatedAt, done.CreatedAt)
	})
	t.Run("resent claim", func(t *testing.T) {
		req, kept := claimN(t, "times:resent")
		again, err := r.store.Claim(ctx, "times:resent", req)
		require.NoError(t, err)
		require.True(t, again.Acquired)
		assert.Equal(t, byte('P'), state(t, "times:resent"))
		assert.Equal(t, kept.CreatedAt, again.Record.CreatedAt, "the server's time, exact")
		assert.True(t, again.Record.LeaseExpiresAt.After(kept.LeaseExpiresAt), "the lease counted from the resend")
		rec, err := r.store.Get(ctx, "times:resent")
		require.NoError(t, err)
		assert.Equal(t, again.Record, rec)
		require.NoError(t, r.store.Complete(ctx, "times:resent", req.Token, []byte("out"), time.Hour))
		done, err := r.store.Get(ctx, "times:resent")
		require.NoError(t, err)
		assert.Equal(t, kept.CreatedAt, done.CreatedAt)
		assert.Equal(t, 1, done.Attempts)
	})
	t.Run("complete", func(t *testing.T) {
		req, kept := claimN(t, "times:complete")
		require.NoError(t, r.store.Complete(ctx, "times:complete", req.Token, []byte("out"), time.Hour))
		done, err := r.store.Get(ctx, "times:complete")
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, done.State)
		assert.Equal(t, kept.CreatedAt, done.CreatedAt)
		assert.True(t, done.UpdatedAt.After(kept.UpdatedAt), "completed at its own time")
		assert.Equal(t, []byte("fp"), done.Fingerprint)
		pttl, err := r.client.PTTL(ctx, "times:complete").Result()
		require.NoError(t, err)
		assert.InDelta(t, float64(time.Hour), float64(pttl), float64(time.Second))
		require.NoError(t, r.store.Complete(ctx, "times:complete", req.Token, []byte("out"), time.Hour), "resent")
	})
	t.Run("fail", func(t *testing.T) {
		req, kept := claimN(t, "times:fail")
		require.NoError(t, r.store.Fail(ctx, "times:fail", req.Token, time.Hour))
		assert.Equal(t, byte('F'), state(t, "times:fail"))
		rec, err := r.store.Get(ctx, "times:fail")
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateFailed, rec.State)
		assert.Equal(t, kept.CreatedAt, rec.CreatedAt)
		// The plain claim's SET meets the FAILED string and hands the key to
		// claim.lua: attempt 2 of the same record.
		next, err := r.store.Claim(ctx, "times:fail", claimReq(time.Minute, nil))
		require.NoError(t, err)
		require.True(t, next.Acquired)
		assert.Equal(t, 2, next.Record.Attempts)
		assert.Equal(t, kept.CreatedAt, next.Record.CreatedAt)
		assert.Equal(t, []byte("fp"), next.Record.Fingerprint)
		for path, s := range r.claimers() {
			other, err := s.Claim(ctx, "times:fail", claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.False(t, other.Acquired, "%s: the key is held", path)
		}
	})
	t.Run("release", func(t *testing.T) {
		req, _ := claimN(t, "times:release")
		require.NoError(t, r.store.Release(ctx, "times:release", req.Token))
		n, err := r.client.Exists(ctx, "times:release").Result()
		require.NoError(t, err)
		assert.Zero(t, n, "a first attempt's release deletes the key")
	})
}

// TestPlainClaimKeyReusedThroughOnce: a COMPLETED key claimed with another
// fingerprint through Once is answered by the plain claim alone (one SET,
// no script) with the record as claim.lua would have given it: not
// acquired, its own fingerprint, which Once's callers compare.
func TestPlainClaimKeyReusedThroughOnce(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin, client, _ := statClients(t, srv.Addr)
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	script, err := redisstore.New(client, nil)
	require.NoError(t, err)
	redisstore.ClaimWithScriptOnly(script)
	loadScripts(t, s)
	ctx := context.Background()
	req := claimReq(time.Minute, []byte("payload A"))
	_, err = s.Claim(ctx, "reused", req)
	require.NoError(t, err)
	require.NoError(t, s.Complete(ctx, "reused", req.Token, []byte("out"), time.Hour))

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: s, CacheMaxBytes: -1})
	require.NoError(t, err)
	require.NoError(t, admin.ConfigResetStat(ctx).Err())
	lease, res, err := once.Claim(ctx, "reused", []byte("payload B"))
	require.NoError(t, err)
	assert.Nil(t, lease, "a COMPLETED key is not acquired")
	assert.False(t, res.Acquired)
	assert.Equal(t, idempotency.StateCompleted, res.Record.State)
	assert.Equal(t, []byte("payload A"), res.Record.Fingerprint, "the stored fingerprint, for the caller's ErrKeyReused")
	assert.Equal(t, []byte("out"), res.Record.Result)
	calls := commandCalls(t, admin)
	assert.Equal(t, 1, calls["set"], "stats %v", calls)
	assert.Zero(t, calls["evalsha"], "stats %v", calls)

	byScript, err := script.Claim(ctx, "reused", claimReq(time.Minute, []byte("payload B")))
	require.NoError(t, err)
	assert.Equal(t, byScript, res, "claim.lua refuses it with the same record")
}

// TestPlainClaimReplicaReadsTheSameTimes: the plain claim under Replicas 1
// with a real replica is one pipeline of SET and WAIT, counted once; a
// claim that goes on to claim.lua (a held key) and a duplicate write
// nothing and are not counted; and the replica reads the N record's times exactly as the
// primary does (Redis propagates SET PX as an absolute expiry), so a
// failover keeps them.
func TestPlainClaimReplicaReadsTheSameTimes(t *testing.T) {
	master, replica := startReplicated(t)
	admin, client, hook := statClients(t, master.Addr)
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 2 * time.Second})
	require.NoError(t, err)
	loadScripts(t, s)
	rclient := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: replica.Addr})
	t.Cleanup(func() { _ = rclient.Close() })
	onReplica, err := redisstore.New(rclient, nil)
	require.NoError(t, err)
	ctx := context.Background()

	before := s.ReplicaStats()
	require.NoError(t, admin.ConfigResetStat(ctx).Err())
	hook.reset()
	req := claimReq(time.Minute, []byte("fp"))
	res, err := s.Claim(ctx, "replicated", req)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	trips, cmds := hook.counts()
	assert.Equal(t, 1, trips, "one pipeline")
	assert.Equal(t, 2, cmds, "SET and WAIT")
	calls := commandCalls(t, admin)
	assert.Equal(t, 1, calls["set"], "stats %v", calls)
	assert.Equal(t, 1, calls["wait"], "stats %v", calls)
	assert.Equal(t, before.Acknowledged+1, s.ReplicaStats().Acknowledged)

	onMaster, err := s.Get(ctx, "replicated")
	require.NoError(t, err)
	fromReplica, err := onReplica.Get(ctx, "replicated")
	require.NoError(t, err, "WAIT returned: the replica has the SET")
	assert.Equal(t, onMaster, fromReplica, "the replica derives the same times from the same absolute expiry")
	mexp, err := admin.PExpireTime(ctx, "replicated").Result()
	require.NoError(t, err)
	rexp, err := rclient.PExpireTime(ctx, "replicated").Result()
	require.NoError(t, err)
	assert.Equal(t, mexp, rexp)

	// A held key: the SET finds it and claim.lua refuses: nothing written,
	// nothing counted (while the replica keeps up, each still has its WAIT
	// in its pipeline, which has nothing new to wait for).
	before = s.ReplicaStats()
	require.NoError(t, admin.ConfigResetStat(ctx).Err())
	other, err := s.Claim(ctx, "replicated", claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.False(t, other.Acquired)
	assert.Equal(t, before, s.ReplicaStats(), "not counted")
	calls = commandCalls(t, admin)
	assert.Equal(t, 1, calls["evalsha"], "stats %v", calls)
	assert.Equal(t, 2, calls["wait"], "the SET's pipeline and the script's, stats %v", calls)

	// The owner completes it; a duplicate is the plain claim alone.
	require.NoError(t, s.Complete(ctx, "replicated", req.Token, []byte("out"), time.Hour))
	before = s.ReplicaStats()
	dup, err := s.Claim(ctx, "replicated", claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, dup.Record.State)
	assert.Equal(t, before, s.ReplicaStats())
	done, err := onReplica.Get(ctx, "replicated")
	require.NoError(t, err)
	assert.Equal(t, onMaster.CreatedAt, done.CreatedAt)
}

// TestPlainClaimReplicaHeldKeyWritesNothing: without a replica in reach,
// a claim of a held key under Replicas 1 (the plain SET, then claim.lua,
// which refuses) writes nothing: once a WAIT fell short it sends no WAIT,
// so it does not wait out ReplicaTimeout, and it is no shortfall.
func TestPlainClaimReplicaHeldKeyWritesNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin, client, _ := statClients(t, srv.Addr)
	s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	loadScripts(t, s)
	ctx := context.Background()
	_, err = s.Claim(ctx, "held", claimReq(time.Minute, nil))
	require.NoError(t, err)

	before := s.ReplicaStats()
	require.NoError(t, admin.ConfigResetStat(ctx).Err())
	res, err := s.Claim(ctx, "held", claimReq(time.Minute, nil))
	require.NoError(t, err)
	assert.False(t, res.Acquired)
	calls := commandCalls(t, admin)
	assert.Equal(t, 1, calls["evalsha"], "the SET, then claim.lua: stats %v", calls)
	assert.Zero(t, calls["wait"], "stats %v", calls)
	assert.Equal(t, before, s.ReplicaStats(), "no shortfall")
}

// TestPlainClaimSurvivesReloadAndRestart: an N record's times are read
// back the same after DEBUG RELOAD and after a restart from the
// append-only file: its expiry is absolute in both.
func TestPlainClaimSurvivesReloadAndRestart(t *testing.T) {
	srv := testserver.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always", "--enable-debug-command", "yes")
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	ctx := context.Background()
	req := claimReq(time.Minute, []byte("fp"))
	_, err = s.Claim(ctx, "durable", req)
	require.NoError(t, err)
	kept, err := s.Get(ctx, "durable")
	require.NoError(t, err)

	require.NoError(t, client.Do(ctx, "debug", "reload").Err())
	rec, err := s.Get(ctx, "durable")
	require.NoError(t, err)
	assert.Equal(t, kept, rec, "after DEBUG RELOAD")
	require.NoError(t, client.Do(ctx, "bgrewriteaof").Err())
	require.Eventually(t, func() bool {
		info, err := client.Info(ctx, "persistence").Result()
		return err == nil && containsLine(info, "aof_rewrite_in_progress:0") && containsLine(info, "aof_rewrite_scheduled:0")
	}, 10*time.Second, 10*time.Millisecond)
	srv.Restart()
	rec, err = s.Get(ctx, "durable")
	require.NoError(t, err)
	assert.Equal(t, kept, rec, "after a restart from the rewritten append-only file")
	require.NoError(t, s.Complete(ctx, "durable", req.Token, []byte("out"), time.Hour), "the owner still holds it")
}

func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// TestPlainClaimMemory: the N record costs what the P record of claim.lua
// costs, byte for byte and in Redis's memory.
func TestPlainClaimMemory(t *testing.T) {
	r := startCodecRedis(t)
	ctx := context.Background()
	req := claimReq(time.Minute, []byte("0123456789abcdef0123456789abcdef"))
	_, err := r.store.Claim(ctx, "memory:plain:", req)
	require.NoError(t, err)
	_, err = r.script.Claim(ctx, "memory:script", idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: req.Lease, TTL: req.TTL, Fingerprint: req.Fingerprint})
	require.NoError(t, err)
	n, err := r.client.StrLen(ctx, "memory:plain:").Result()
	require.NoError(t, err)
	p, err := r.client.StrLen(ctx, "memory:script").Result()
	require.NoError(t, err)
	assert.Equal(t, p, n)
	nm, err := r.client.MemoryUsage(ctx, "memory:plain:").Result()
	require.NoError(t, err)
	pm, err := r.client.MemoryUsage(ctx, "memory:script").Result()
	require.NoError(t, err)
	t.Logf("IN_PROGRESS record, 32-byte token and fingerprint: N %d bytes, P %d bytes (MEMORY USAGE)", nm, pm)
	assert.Equal(t, pm, nm)
}

// TestPlainClaimClusterRouting: on a cluster client the plain SET is routed
// by its key, on its own and in the pipeline of SET and WAIT under
// Replicas (to the key's primary): the N record lands on the primary of
// its slot, a second claim of it is refused there, and every transition
// reads it, for keys all over the slots and keys sharing one by hash tag.
func TestPlainClaimClusterRouting(t *testing.T) {
	t.Parallel()
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	modes := map[string]redisstore.Options{
		"on its own": {},
		// The test's cluster has no replicas: each WAIT falls short.
		"replica acknowledgement": {Replicas: 1, ReplicaTimeout: 10 * time.Millisecond},
	}
	for mode, opts := range modes {
		s, err := redisstore.New(client, &opts)
		require.NoError(t, err)
		for i := range 24 {
			key := fmt.Sprintf("route:%s:%d", mode, i)
			if i%3 == 0 {
				key = fmt.Sprintf("{route-tag}:%s:%d", mode, i)
			}
			req := claimReq(time.Minute, []byte("fp"))
			res, err := s.Claim(ctx, key, req)
			require.NoError(t, err, key)
			require.True(t, res.Acquired, key)
			node, err := client.MasterForKey(ctx, key)
			require.NoError(t, err)
			raw, err := node.Get(ctx, key).Bytes()
			require.NoError(t, err, "%s is on its slot's primary", key)
			assert.Equal(t, byte('N'), raw[1])
			other, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
			require.NoError(t, err)
			assert.False(t, other.Acquired, "%s has one owner", key)
			require.NoError(t, s.Renew(ctx, key, req.Token, time.Minute))
			require.NoError(t, s.Complete(ctx, key, req.Token, []byte("out"), time.Hour))
			dup, err := s.Claim(ctx, key, claimReq(time.Minute, []byte("other")))
			require.NoError(t, err)
			assert.False(t, dup.Acquired)
			assert.Equal(t, []byte("fp"), dup.Record.Fingerprint)
		}
	}
}
