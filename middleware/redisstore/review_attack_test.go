package redisstore_test

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// Records' prefix is literal whatever its bytes: a backslash, and bytes
// that are not UTF-8 (keys may hold any bytes).
func TestRecordsPrefixOfAnyBytes(t *testing.T) {
	t.Parallel()
	s, client, prefix := newStore(t)
	ctx := context.Background()
	for _, p := range []string{prefix + `a\b:`, prefix + "\xff\xc0\x00:", prefix + `\*:`} {
		_, err := s.Claim(ctx, p+"k", claimReq(time.Minute, nil))
		require.NoError(t, err)
		require.NoError(t, client.Set(ctx, prefix+"other", "x", time.Minute).Err())
		var got []string
		for e, err := range s.Records(ctx, p) {
			require.NoError(t, err)
			require.NoError(t, e.Err)
			got = append(got, e.Key)
		}
		assert.Equal(t, []string{p + "k"}, got, "prefix %q", p)
	}
}

// Complete racing Fail, or Release, of the same owner from two clients:
// exactly one transition wins, and the record is the winner's.
func TestCompleteRacingFailAndRelease(t *testing.T) {
	t.Parallel()
	s1, _, prefix := newStore(t)
	s2, _, _ := newStore(t)
	ctx := context.Background()
	for i := range 100 {
		key := prefix + "race"
		req := claimReq(time.Minute, nil)
		if i%4 == 3 { // a later attempt, which Release sets back to FAILED
			first := claimReq(time.Minute, nil)
			_, err := s1.Claim(ctx, key, first)
			require.NoError(t, err)
			require.NoError(t, s1.Fail(ctx, key, first.Token, time.Minute))
		}
		res, err := s1.Claim(ctx, key, req)
		require.NoError(t, err)
		require.True(t, res.Acquired)
		var wg sync.WaitGroup
		var completeErr, otherErr error
		release := i%2 == 1
		wg.Add(2)
		go func() { defer wg.Done(); completeErr = s1.Complete(ctx, key, req.Token, []byte("out"), time.Minute) }()
		go func() {
			defer wg.Done()
			if release {
				otherErr = s2.Release(ctx, key, req.Token)
			} else {
				otherErr = s2.Fail(ctx, key, req.Token, time.Minute)
			}
		}()
		wg.Wait()
		rec, err := s1.Get(ctx, key)
		require.NoError(t, err)
		switch {
		case completeErr == nil:
			assert.Equal(t, idempotency.StateCompleted, rec.State, i)
			assert.Equal(t, []byte("out"), rec.Result, i)
			if !release {
				assert.ErrorIs(t, otherErr, idempotency.ErrLeaseLost, i)
			}
		default:
			require.ErrorIs(t, completeErr, idempotency.ErrLeaseLost, i)
			require.NoError(t, otherErr, i)
			if release && i%4 != 3 {
				assert.Equal(t, idempotency.StateAbsent, rec.State, i)
			} else {
				assert.Equal(t, idempotency.StateFailed, rec.State, i)
			}
		}
		require.NoError(t, s1.Delete(ctx, key))
	}
}

// Concurrent IsDuplicate calls of one key from many clients: exactly one
// sees it fresh.
func TestExpiringKeyRepositoryConcurrent(t *testing.T) {
	t.Parallel()
	_, client, prefix := newStore(t)
	repo, err := redisstore.NewExpiringKeyRepository(client, prefix, time.Minute)
	require.NoError(t, err)
	ctx := context.Background()
	for round := range 20 {
		key := string(rune('a' + round))
		var fresh, dup atomic.Int32
		var wg sync.WaitGroup
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := repo.IsDuplicate(ctx, key)
				if !assert.NoError(t, err) {
					return
				}
				if d {
					dup.Add(1)
				} else {
					fresh.Add(1)
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, int32(1), fresh.Load(), "round %d", round)
		assert.Equal(t, int32(31), dup.Load(), "round %d", round)
	}
}

// A slot moved while its keys are held, without replica acknowledgement
// (the cluster client follows ASK and MOVED itself): during the migration
// (ASK, to a node that never loaded a script) and after it (MOVED), the
// owner renews and completes, fresh keys are claimed where they now live,
// duplicates are answered, and no call fails. Then keys of odd bytes and
// hash tags go through every step on the Cluster.
func TestClusterSlotMovedMidRun(t *testing.T) {
	addrs := testserver.StartRedisCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs, ClusterStateReloadInterval: time.Hour})
	t.Cleanup(func() { _ = client.Close() })
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	m := newSlotMover(t, addrs)
	ctx := context.Background()
	const tag = "{moved-mid-run}"
	slot, err := m.admins[addrs[0]].ClusterKeySlot(ctx, tag).Result()
	require.NoError(t, err)
	node, err := client.MasterForKey(ctx, tag)
	require.NoError(t, err)
	src, dst := node.Options().Addr, ""
	for _, a := range addrs {
		if a != src {
			dst = a
			break
		}
	}
	claim := func(key string) idempotency.ClaimRequest {
		req := claimReq(time.Minute, nil)
		res, err := s.Claim(ctx, key, req)
		require.NoError(t, err, key)
		require.True(t, res.Acquired, key)
		return req
	}
	done := func(key string) {
		res, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
		require.NoError(t, err, key)
		assert.False(t, res.Acquired, key)
		assert.Equal(t, idempotency.StateCompleted, res.Record.State, key)
		assert.Equal(t, []byte(key), res.Record.Result, key)
	}
	a, b, c, d := tag+"a", tag+"b", tag+"c", tag+"d"
	ra, rb, rc := claim(a), claim(b), claim(c)
	require.NoError(t, s.Complete(ctx, c, rc.Token, []byte(c), time.Hour))

	m.begin(slot, src, dst)
	m.migrate(src, dst, a, c) // b stays on src for now
	require.NoError(t, s.Renew(ctx, a, ra.Token, time.Minute), "ASK to a node without the script")
	require.NoError(t, s.Renew(ctx, b, rb.Token, time.Minute), "still on src")
	done(c)
	rd := claim(d) // absent on src: ASK, written on dst
	rec, err := s.Get(ctx, a)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateInProgress, rec.State)
	require.NoError(t, s.Complete(ctx, a, ra.Token, []byte(a), time.Hour))

	m.finish(slot, src, dst)
	require.NoError(t, s.Complete(ctx, b, rb.Token, []byte(b), time.Hour), "MOVED")
	require.NoError(t, s.Complete(ctx, d, rd.Token, []byte(d), time.Hour))
	for _, k := range []string{a, b, c, d} {
		done(k)
		n, err := m.admins[dst].Exists(ctx, k).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "%s lives on the slot's new node", k)
	}

	// Keys of odd bytes, hash tags among them (an empty one hashes the
	// whole key), and a 64 KiB key: each lives in the slot Redis computes
	// for it, and Records finds it under a prefix of odd bytes.
	odd := "odd\x00{\xff*"
	keys := []string{odd + "\x00", odd + "{}x", odd + "}{x}", odd + "{t}a", odd + "{t}b", odd + strings.Repeat("\xc0{", 1<<15)}
	for _, key := range keys {
		req := claim(key)
		require.NoError(t, s.Renew(ctx, key, req.Token, time.Minute))
		require.NoError(t, s.Complete(ctx, key, req.Token, []byte(key), time.Hour))
		done(key)
		slot, err := client.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		owner, err := client.MasterForKey(ctx, key)
		require.NoError(t, err)
		shards, err := owner.ClusterShards(ctx).Result()
		require.NoError(t, err)
		self := owner.Options().Addr
		in := false
		for _, sh := range shards {
			for _, r := range sh.Slots {
				for _, n := range sh.Nodes {
					in = in || (r.Start <= slot && slot <= r.End && n.Role == "master" && net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)) == self)
				}
			}
		}
		assert.True(t, in, "the key's master serves its slot %d", slot)
		n, err := owner.Exists(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n)
	}
	var got []string
	for e, err := range s.Records(ctx, odd) {
		require.NoError(t, err)
		require.NoError(t, e.Err)
		assert.Equal(t, idempotency.StateCompleted, e.Record.State)
		got = append(got, e.Key)
	}
	assert.ElementsMatch(t, keys, got)
}

// deleteAfterScan deletes a key the moment a SCAN has listed it, as if it
// expired between the SCAN and the read of its record.
type deleteAfterScan struct {
	admin *redis.Client
	key   string
}

func (h deleteAfterScan) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h deleteAfterScan) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h deleteAfterScan) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if sc, ok := cmd.(*redis.ScanCmd); ok {
			if keys, _ := sc.Val(); slices.Contains(keys, h.key) {
				_ = h.admin.Unlink(ctx, h.key).Err()
			}
		}
		return err
	}
}

// A key listed by Records that is gone before its record is read is an
// Entry of StateAbsent, without TTL or size, and the walk goes on.
func TestRecordsKeyGoneDuringTheWalk(t *testing.T) {
	t.Parallel()
	_, admin, prefix := newStore(t)
	ctx := context.Background()
	client := testserver.RedisClient(t)
	client.AddHook(deleteAfterScan{admin: admin, key: prefix + "gone"})
	s, err := redisstore.New(client, nil)
	require.NoError(t, err)
	for _, k := range []string{"gone", "kept"} {
		_, err := s.Claim(ctx, prefix+k, claimReq(time.Minute, nil))
		require.NoError(t, err)
	}
	got := map[string]idempotency.Entry{}
	for e, err := range s.Records(ctx, prefix) {
		require.NoError(t, err)
		require.NoError(t, e.Err)
		got[e.Key] = e
	}
	require.Len(t, got, 2, "%v", got)
	assert.Equal(t, idempotency.Entry{Key: prefix + "gone", Record: idempotency.Record{State: idempotency.StateAbsent}}, got[prefix+"gone"])
	assert.Equal(t, idempotency.StateInProgress, got[prefix+"kept"].Record.State)
	assert.Greater(t, got[prefix+"kept"].TTL, time.Minute)
	assert.Greater(t, got[prefix+"kept"].Bytes, int64(0))
}

// A Complete of a 1 MiB result that a full Redis refuses writes nothing:
// the key stays IN_PROGRESS under its owner, and once memory is freed the
// same Complete stores the whole result, over a fresh claim's N record and
// over the P record a renewal wrote.
func TestFullRedisRefusesABigCompleteWhole(t *testing.T) {
	srv := testserver.StartRedis(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	admin := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	s, err := redisstore.New(admin, nil)
	require.NoError(t, err)
	ctx := context.Background()
	result := make([]byte, 1<<20)
	for i := range result {
		result[i] = byte(i * 7)
	}
	reqs := map[string]idempotency.ClaimRequest{"fresh": claimReq(time.Minute, []byte("fp")), "renewed": claimReq(time.Minute, nil)}
	for key, req := range reqs {
		_, err := s.Claim(ctx, key, req)
		require.NoError(t, err)
	}
	require.NoError(t, s.Renew(ctx, "renewed", reqs["renewed"].Token, time.Minute))
	fillRedis(t, admin)
	for key, req := range reqs {
		err := s.Complete(ctx, key, req.Token, result, time.Hour)
		require.Error(t, err, key)
		assert.Contains(t, err.Error(), "Redis is full", key)
		rec, err := s.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateInProgress, rec.State, key)
		assert.Equal(t, req.Token, rec.Token, key)
	}
	require.NoError(t, admin.FlushAll(ctx).Err()) // the records too: claim again
	for key, req := range reqs {
		_, err := s.Claim(ctx, key, req)
		require.NoError(t, err)
	}
	require.NoError(t, s.Renew(ctx, "renewed", reqs["renewed"].Token, time.Minute))
	for key, req := range reqs {
		require.NoError(t, s.Complete(ctx, key, req.Token, result, time.Hour), key)
		dup, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, dup.Record.State, key)
		assert.True(t, bytes.Equal(result, dup.Record.Result), key)
		assert.Equal(t, req.Fingerprint, dup.Record.Fingerprint, key)
	}
}

// Options at their edges on a Redis without replicas: a ReplicaTimeout of
// 1 ns (WAIT's timeout is never 0, which would block for ever), more
// replicas than a server could have, and a context without deadline.
// Every transition that wrote is one shortfall, every other none, and no
// call waits long.
func TestReplicaOptionsAtTheirEdges(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 1 << 30} {
		_, client, prefix := newStore(t)
		var (
			mu   sync.Mutex
			seen []string
		)
		s, err := redisstore.New(client, &redisstore.Options{Replicas: replicas, ReplicaTimeout: time.Nanosecond,
			OnReplicaShortfall: func(op, key string, acked int) {
				mu.Lock()
				seen = append(seen, op+" "+key[len(prefix):])
				mu.Unlock()
				assert.Zero(t, acked)
			}})
		require.NoError(t, err)
		ctx := context.Background()
		start := time.Now()
		req := claimReq(time.Minute, nil)
		_, err = s.Claim(ctx, prefix+"k", req)
		require.NoError(t, err)
		_, err = s.Claim(ctx, prefix+"k", claimReq(time.Minute, nil)) // held: writes nothing
		require.NoError(t, err)
		require.NoError(t, s.Renew(ctx, prefix+"k", req.Token, time.Minute))
		require.NoError(t, s.Complete(ctx, prefix+"k", req.Token, nil, time.Minute))
		_, err = s.Claim(ctx, prefix+"k", claimReq(time.Minute, nil)) // duplicate
		require.NoError(t, err)
		f := claimReq(time.Minute, nil)
		_, err = s.Claim(ctx, prefix+"f", f)
		require.NoError(t, err)
		require.NoError(t, s.Fail(ctx, prefix+"f", f.Token, time.Minute))
		assert.Less(t, time.Since(start), 2*time.Second, "replicas %d", replicas)
		mu.Lock()
		assert.Equal(t, []string{"claim k", "renew k", "complete k", "claim f"}, seen, "replicas %d", replicas)
		mu.Unlock()
	}
}

// On a ring, which New takes, Records walks every shard, as it walks
// every master of a Cluster.
func TestRecordsOnRing(t *testing.T) {
	t.Parallel()
	a, b := testserver.StartRedis(t), testserver.StartRedis(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	s, err := redisstore.New(ring, nil)
	require.NoError(t, err)
	ctx := context.Background()
	want := map[string]bool{}
	for i := range 20 {
		key := "ring:" + string(rune('a'+i))
		_, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
		require.NoError(t, err)
		want[key] = true
	}
	for _, addr := range []string{a.Addr, b.Addr} {
		c := redis.NewClient(&redis.Options{Addr: addr})
		n, err := c.DBSize(ctx).Result()
		_ = c.Close()
		require.NoError(t, err)
		require.NotZero(t, n, "both shards hold keys")
	}
	got := map[string]bool{}
	for e, err := range s.Records(ctx, "ring:") {
		require.NoError(t, err)
		require.NoError(t, e.Err)
		got[e.Key] = true
	}
	assert.Equal(t, want, got)
}
