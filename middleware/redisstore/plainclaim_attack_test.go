package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
				lossy, err := redisstore.NewWithOptions(client, redisstore.Options{DisableAutoPipelining: mode == "on its own"})
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
// SET, claim.lua on Redis 7, claim.lua as on Redis 5 and 6) race for one
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
			req := idempotency.ClaimRequest{Token: idempotency.NewToken(), Lease: time.Minute, TTL: 2 * time.Hour}
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
