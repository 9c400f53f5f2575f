package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

func TestCmdTemplateSubstitutesTheKeyOnly(t *testing.T) {
	key := "idem:orders:42"
	tmpl, err := newTemplate([]any{"evalsha", "8835df00", int64(1), key, "tok", int64(60000), []byte(key), ""}, key)
	require.NoError(t, err)
	assert.Equal(t, []int{3, 6}, tmpl.keyAt, "string and []byte arguments equal to the key")
	assert.Equal(t, []any{"evalsha", "8835df00", int64(1), "idem:orders:43", "tok", int64(60000), "idem:orders:43", ""},
		tmpl.with("idem:orders:43"))
	assert.Equal(t, []any{"evalsha", "8835df00", int64(1), key, "tok", int64(60000), []byte(key), ""}, tmpl.args, "the template is left as it was")
	assert.Equal(t, `EVALSHA 8835df00 1 <key> tok 60000 <key> ""`, tmpl.String())

	long := strings.Repeat("r", 50)
	tmpl, err = newTemplate([]any{"SET", key, long}, key)
	require.NoError(t, err)
	assert.Equal(t, "SET <key> "+strings.Repeat("r", 40)+"…", tmpl.String())

	for _, args := range [][]any{
		{"eval", "return redis.call('GET', '" + key + "')", 0},
		{"set", key + ":lock", "1"},
		{"hset", "other", "field", []byte("{" + key + "}")},
	} {
		_, err := newTemplate(args, key)
		assert.ErrorContains(t, err, "inside a larger value", "%v", args)
	}
}

// TestCaptureAndReplay captures what the store sends and replays it on
// other keys: fresh messages end COMPLETED after one attempt, claims alone
// do not, the floor's keys end "done", and replayed duplicates acquire
// nothing.
func TestCaptureAndReplay(t *testing.T) {
	ctx := context.Background()
	c, stop, err := startRedis()
	require.NoError(t, err)
	t.Cleanup(stop)
	store := newStore(c)

	ours, err := captureStore(ctx, c.Options().Addr)
	require.NoError(t, err)
	require.NotEmpty(t, ours.claim)
	require.NotEmpty(t, ours.complete)
	require.NotEmpty(t, ours.duplicate)
	t.Logf("claim %v, complete %v, duplicate %v", templateStrings(ours.claim), templateStrings(ours.complete), templateStrings(ours.duplicate))

	key := func(w, i int) string { return fmt.Sprintf("o:%d:%d", w, i) }
	counts, perSecond, _, err := runLoad(ctx, c, 20*time.Millisecond, msgShape{first: ours.claim, second: ours.complete, nilOK: true}, key)
	require.NoError(t, err)
	assert.Positive(t, perSecond)
	for w, n := range counts {
		require.GreaterOrEqual(t, n, floorPipeline/(len(ours.claim)+len(ours.complete)), "at least one pipeline per connection")
		for i := range n {
			rec, err := store.Get(ctx, key(w, i))
			require.NoError(t, err)
			require.Equal(t, idempotency.StateCompleted, rec.State, key(w, i))
			require.Equal(t, 1, rec.Attempts, key(w, i))
		}
	}

	// Claims alone leave the keys IN_PROGRESS: the check tells.
	key = func(w, i int) string { return fmt.Sprintf("c:%d:%d", w, i) }
	_, _, _, err = runLoad(ctx, c, 10*time.Millisecond, msgShape{first: ours.claim, nilOK: true}, key)
	require.NoError(t, err)
	assert.ErrorContains(t, checkCompleted(ctx, c, store, true, key(0, 0)), "not COMPLETED")

	// The floor's fresh messages end "done"; a GET of a key that is gone fails.
	key = func(w, i int) string { return fmt.Sprintf("f:%d:%d", w, i) }
	set, _ := newTemplate([]any{"set", "{key}", "1", "nx", "px", int64(60000)}, "{key}")
	done, _ := newTemplate([]any{"set", "{key}", "done", "xx", "px", int64(60000)}, "{key}")
	get, _ := newTemplate([]any{"get", "{key}"}, "{key}")
	counts, _, _, err = runLoad(ctx, c, 10*time.Millisecond, msgShape{first: []cmdTemplate{set}, second: []cmdTemplate{done}}, key)
	require.NoError(t, err)
	require.NoError(t, checkCompleted(ctx, c, store, false, key(3, counts[3]-1)))
	_, _, _, err = runLoad(ctx, c, 10*time.Millisecond, msgShape{first: []cmdTemplate{get}}, func(int, int) string { return "gone" })
	require.ErrorContains(t, err, "nil")

	// Duplicates: the replayed claims acquire nothing.
	_, _, _, err = runLoad(ctx, c, 10*time.Millisecond, msgShape{first: ours.duplicate, nilOK: true}, func(int, int) string { return "o:0:0" })
	require.NoError(t, err)
	rec, err := store.Get(ctx, "o:0:0")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, 1, rec.Attempts)
}

// TestRunFloor runs the floor section once, briefly.
func TestRunFloor(t *testing.T) {
	fl, err := runFloor(context.Background(), options{floorDur: 20 * time.Millisecond, floorRounds: 2})
	require.NoError(t, err)
	for _, p := range []FloorPair{fl.Fresh, fl.Duplicate} {
		assert.Len(t, p.Ours.Rates, 2)
		assert.Len(t, p.Floor.Rates, 2)
		assert.Positive(t, p.RateRatio)
		assert.Positive(t, p.Ours.RedisCPU)
	}
}

// TestFloorDedup runs the e2e section's floor on the shared Redis: a fresh
// message runs the handler and ends "done", a duplicate does not run it, a
// failed handler leaves nothing behind.
func TestFloorDedup(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: testserver.RedisAddr(t)})
	prefix := testserver.UniqueName("idembenchtest:") + ":"
	t.Cleanup(func() {
		_ = rediskeys.Delete(context.Background(), c, prefix+"*")
		_ = c.Close()
	})
	f := newFloorDedup(c, prefix, time.Minute, time.Hour)
	runs := 0
	fail := false
	chain := f.Middleware(func(m *message.Message) ([]*message.Message, error) {
		runs++
		if fail {
			return nil, errors.New("handler failed")
		}
		return []*message.Message{message.NewMessage("out", nil)}, nil
	})
	msg := func(id string) *message.Message {
		m := message.NewMessage("uuid-"+id, nil)
		m.Metadata.Set("requestId", id)
		return m
	}

	out, err := chain(msg("a"))
	require.NoError(t, err)
	assert.Len(t, out, 1)
	assert.Equal(t, "done", c.Get(ctx, prefix+"a").Val())
	ttl := c.PTTL(ctx, prefix+"a").Val()
	assert.Greater(t, ttl, 59*time.Minute, "the TTL, not the lease")

	out, err = chain(msg("a"))
	require.NoError(t, err)
	assert.Empty(t, out, "a duplicate: acked, no output")
	assert.Equal(t, 1, runs)

	fail = true
	_, err = chain(msg("b"))
	require.Error(t, err)
	assert.Zero(t, c.Exists(ctx, prefix+"b").Val(), "a failed message's key deleted")
	fail = false
	_, err = chain(msg("b"))
	require.NoError(t, err)
	assert.Equal(t, 3, runs, "the redelivery ran it again")

	// Without requestId: the UUID.
	_, err = chain(message.NewMessage("uuid-c", nil))
	require.NoError(t, err)
	assert.Equal(t, "done", c.Get(ctx, prefix+"uuid-c").Val())
}
