package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// slotMover moves a slot between a cluster's masters as redis-cli --cluster
// reshard does: SETSLOT IMPORTING on the target, MIGRATING on the source,
// MIGRATE of the slot's keys, then SETSLOT NODE on the target, the source
// and every other master.
type slotMover struct {
	t       *testing.T
	masters []string
	admins  map[string]*redis.Client
	ids     map[string]string
}

func newSlotMover(t *testing.T, masters []string) *slotMover {
	m := &slotMover{t: t, masters: masters, admins: map[string]*redis.Client{}, ids: map[string]string{}}
	for _, addr := range masters {
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
		t.Cleanup(func() { _ = c.Close() })
		id, err := c.Do(context.Background(), "cluster", "myid").Text()
		require.NoError(t, err)
		m.admins[addr], m.ids[addr] = c, id
	}
	return m
}

// begin opens slot's migration from src to dst: from now on src answers
// ASK for the slot's keys it no longer has.
func (m *slotMover) begin(slot int64, src, dst string) {
	ctx := context.Background()
	require.NoError(m.t, m.admins[dst].Do(ctx, "cluster", "setslot", slot, "importing", m.ids[src]).Err())
	require.NoError(m.t, m.admins[src].Do(ctx, "cluster", "setslot", slot, "migrating", m.ids[dst]).Err())
}

// migrate moves keys of the slot from src to dst.
func (m *slotMover) migrate(src, dst string, keys ...string) {
	host, port, _ := strings.Cut(dst, ":")
	args := []any{"migrate", host, port, "", 0, 10000, "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	require.NoError(m.t, m.admins[src].Do(context.Background(), args...).Err())
}

// finish moves the slot's remaining keys and gives the slot to dst: from
// now on every other master answers MOVED for it.
func (m *slotMover) finish(slot int64, src, dst string) {
	ctx := context.Background()
	for {
		keys, err := m.admins[src].ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		require.NoError(m.t, err)
		if len(keys) == 0 {
			break
		}
		m.migrate(src, dst, keys...)
	}
	order := []string{dst, src}
	for _, a := range m.masters {
		if a != dst && a != src {
			order = append(order, a)
		}
	}
	for _, a := range order {
		require.NoError(m.t, m.admins[a].Do(ctx, "cluster", "setslot", slot, "node", m.ids[dst]).Err())
	}
}

// TestReplicaAckFollowsSlotMoves: under Options.Replicas, where the store
// sends each claim, renewal and completion with its WAIT to the key's
// primary itself, a slot moved while its keys are held (MOVED), and one
// half moved (ASK), cost no call: each is followed at once, with the
// cluster client's periodic reload an hour away. The owner renews and
// completes, a duplicate is answered, fresh keys are claimed on the node
// that now serves them, and every transition that wrote is counted once,
// on a cluster whose replicas keep up (WAIT in the script's pipeline) and
// on one without replicas (every WAIT falls short, so after the first one
// a node's calls send WAIT after the script). Then one primary's replica
// stops: only that primary's calls go over to WAIT after a write.
func TestReplicaAckFollowsSlotMoves(t *testing.T) {
	clusters := []struct {
		name    string
		start   func(t *testing.T) ([]string, map[string]*testserver.RedisServer)
		timeout time.Duration
	}{
		{"replicas keep up", func(t *testing.T) ([]string, map[string]*testserver.RedisServer) {
			return testserver.StartReplicatedRedisCluster(t)
		}, 2 * time.Second},
		{"no replica", func(t *testing.T) ([]string, map[string]*testserver.RedisServer) {
			return testserver.StartRedisCluster(t), nil
		}, 5 * time.Millisecond},
	}
	for _, cl := range clusters {
		t.Run(cl.name, func(t *testing.T) {
			addrs, replicas := cl.start(t)
			client := redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true, Addrs: addrs, ClusterStateReloadInterval: time.Hour})
			t.Cleanup(func() { _ = client.Close() })
			s, err := redisstore.New(client, &redisstore.Options{Replicas: 1, ReplicaTimeout: cl.timeout})
			require.NoError(t, err)
			m := newSlotMover(t, addrs)
			ctx := context.Background()
			const tag = "{slot-moves}"
			slot, err := m.admins[addrs[0]].ClusterKeySlot(ctx, tag).Result()
			require.NoError(t, err)
			node, err := client.MasterForKey(ctx, tag)
			require.NoError(t, err)
			src := node.Options().Addr
			var others []string
			for _, a := range addrs {
				if a != src {
					others = append(others, a)
				}
			}
			dst, third := others[0], others[1]
			writes := 0
			claim := func(key string, req idempotency.ClaimRequest) {
				t.Helper()
				res, err := s.Claim(ctx, key, req)
				require.NoError(t, err, key)
				require.True(t, res.Acquired, key)
				writes++
			}
			owned := func(what, key string, run func() error) {
				t.Helper()
				require.NoError(t, run(), "%s %s", what, key)
				writes++
			}
			on := func(addr, key string) { // ASKING: addr may be importing the slot
				t.Helper()
				pipe := m.admins[addr].Pipeline()
				pipe.Do(ctx, "asking")
				exists := pipe.Exists(ctx, key)
				_, err := pipe.Exec(ctx)
				require.NoError(t, err)
				assert.Equal(t, int64(1), exists.Val(), "%s lives on %s", key, addr)
			}

			held, done := tag+"held", tag+"done"
			heldReq, doneReq := claimReq(time.Minute, nil), claimReq(time.Minute, nil)
			claim(held, heldReq)
			claim(done, doneReq)
			owned("complete", done, func() error { return s.Complete(ctx, done, doneReq.Token, []byte("out"), time.Hour) })

			// The whole slot moves: the client still maps it to src,
			// which answers MOVED.
			m.begin(slot, src, dst)
			m.finish(slot, src, dst)
			owned("renew", held, func() error { return s.Renew(ctx, held, heldReq.Token, time.Minute) })
			dup, err := s.Claim(ctx, done, claimReq(time.Minute, nil))
			require.NoError(t, err, "duplicate of %s", done)
			assert.Equal(t, idempotency.StateCompleted, dup.Record.State)
			assert.Equal(t, []byte("out"), dup.Record.Result)
			fresh := tag + "fresh"
			freshReq := claimReq(time.Minute, nil)
			claim(fresh, freshReq)
			owned("complete", held, func() error { return s.Complete(ctx, held, heldReq.Token, nil, time.Hour) })
			on(dst, held)
			on(dst, fresh)

			// Half of a move: the slot is dst's, migrating to third, which
			// has one of its keys; dst answers ASK for the keys it lacks.
			moving, stay := tag+"moving", tag+"stay"
			movingReq, stayReq := claimReq(time.Minute, nil), claimReq(time.Minute, nil)
			claim(moving, movingReq)
			claim(stay, stayReq)
			m.begin(slot, dst, third)
			m.migrate(dst, third, moving)
			owned("renew", moving, func() error { return s.Renew(ctx, moving, movingReq.Token, time.Minute) })
			owned("renew", stay, func() error { return s.Renew(ctx, stay, stayReq.Token, time.Minute) })
			asked := tag + "asked"
			askedReq := claimReq(time.Minute, nil)
			claim(asked, askedReq)
			on(third, moving)
			on(dst, stay)
			on(third, asked)
			m.finish(slot, dst, third)
			for key, token := range map[string]string{moving: movingReq.Token, stay: stayReq.Token, asked: askedReq.Token, fresh: freshReq.Token} {
				owned("complete", key, func() error { return s.Complete(ctx, key, token, nil, time.Hour) })
				rec, err := s.Get(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, idempotency.StateCompleted, rec.State, key)
				on(third, key)
			}
			stats := s.ReplicaStats()
			t.Logf("%d transitions wrote; %+v", writes, stats)
			assert.Equal(t, uint64(writes), stats.Acknowledged+stats.Shortfalls, "each transition that wrote, counted once")
			if replicas == nil {
				assert.Zero(t, stats.Acknowledged)
				return
			}
			assert.Zero(t, stats.Shortfalls)

			// One primary's replica lost: only that primary's calls send
			// WAIT after a write alone; the others keep theirs in the
			// pipeline, acknowledged.
			replicas[third].Stop()
			keyOn := func(addr string) string {
				for i := 0; ; i++ {
					key := fmt.Sprintf("{lag-%d}k", i)
					if n, err := client.MasterForKey(ctx, key); err == nil && n.Options().Addr == addr {
						return key
					}
				}
			}
			waits := func(addr, key string) int {
				t.Helper()
				require.NoError(t, m.admins[addr].ConfigResetStat(ctx).Err())
				_, err := s.Claim(ctx, key, claimReq(time.Minute, nil))
				require.NoError(t, err, key)
				return commandCalls(t, m.admins[addr])["wait"]
			}
			lagging, healthy := keyOn(third), keyOn(src)
			before := s.ReplicaStats()
			assert.Equal(t, 1, waits(third, lagging), "a write on the lagging primary waits")
			assert.Equal(t, redisstore.ReplicaStats{Acknowledged: before.Acknowledged, Shortfalls: 1}, s.ReplicaStats())
			assert.Zero(t, waits(third, lagging), "a claim of its held key sends no WAIT")
			assert.Equal(t, 1, waits(src, healthy), "a write on another primary")
			assert.Positive(t, waits(src, healthy), "a claim of its held key (claim.lua's first run there: NOSCRIPT, then EVAL)")
			assert.Equal(t, 2, waits(src, healthy), "a claim of its held key: WAIT in the SET's pipeline and the script's still")
			assert.Equal(t, redisstore.ReplicaStats{Acknowledged: before.Acknowledged + 1, Shortfalls: 1}, s.ReplicaStats())
		})
	}
}
