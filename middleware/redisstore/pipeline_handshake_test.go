package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// stallHandshakes stalls the proxy's open connections when a connection
// sends its first command after HELLO (CLIENT MAINT_NOTIFICATIONS or
// CLIENT SETINFO, in go-redis's handshake), until it has done so limit
// times: a connection then stalls in the middle of its handshake, with the
// call that opened it waiting on it.
type stallHandshakes struct {
	proxy  *testserver.FaultProxy
	limit  int32
	stalls atomic.Int32
}

func (h *stallHandshakes) stall(name string) {
	if name == "hello" {
		return
	}
	if n := h.stalls.Add(1); n <= h.limit {
		h.proxy.StallAll()
	}
}

func (h *stallHandshakes) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallHandshakes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "client" {
			h.stall(cmd.Name())
		}
		return next(ctx, cmd)
	}
}

func (h *stallHandshakes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "client" {
			h.stall(cmds[0].Name())
		}
		return next(ctx, cmds)
	}
}

// TestAutoPipeliningFlowsPastStalledHandshakes: two calls are stuck on
// connections that stalled in the middle of go-redis's connection
// handshake. The calls made meanwhile, 20 claims with a second to live,
// all succeed on a connection of their own, with the plain claim and with
// claim.lua alike. On Redis 7, which refuses CLIENT MAINT_NOTIFICATIONS, a
// client in go-redis's automatic maintenance-notification mode gives the
// feature up on the first refusal under a lock of the client's that waits
// for every handshake in flight: the connection the 20 claims were batched
// on then waited for the stalled ones. NewFromURL's client does not ask
// for the notifications.
func TestAutoPipeliningFlowsPastStalledHandshakes(t *testing.T) {
	direct := testserver.RedisClient(t)
	prefix := keyPrefix(t, direct)
	ds, err := redisstore.New(direct, nil)
	require.NoError(t, err)
	require.NoError(t, fresh(context.Background(), ds, prefix+"warm")) // the scripts are loaded
	for _, path := range []struct {
		name string
		set  func(*redisstore.Store)
	}{{"plain claim", func(*redisstore.Store) {}}, {"claim.lua", redisstore.ClaimWithScriptOnly}} {
		t.Run(path.name, func(t *testing.T) {
			proxy := testserver.StartFaultProxy(t, testserver.RedisAddr(t))
			s, client, err := redisstore.NewFromURL("redis://"+proxy.Addr+"?max_retries=-1", nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Close() })
			path.set(s)
			hook := &stallHandshakes{proxy: proxy, limit: 2}
			client.AddHook(hook)
			p := prefix + strconv.Itoa(len(path.name)) + ":"

			var stuck sync.WaitGroup
			for i := range 2 {
				stuck.Go(func() { _ = claimWithin(s, p+"stuck"+strconv.Itoa(i), 10*time.Second) })
				require.Eventually(t, func() bool { return hook.stalls.Load() == int32(i+1) }, 5*time.Second, time.Millisecond)
			}
			require.Equal(t, 2, proxy.Conns())

			const calls = 20
			errs := make(chan error, calls)
			var wg sync.WaitGroup
			for i := range calls {
				wg.Go(func() { errs <- claimWithin(s, p+"k"+strconv.Itoa(i), time.Second) })
			}
			wg.Wait()
			close(errs)
			failed := 0
			var first error
			for err := range errs {
				if err != nil {
					failed++
					first = cmpErr(first, err)
				}
			}
			proxy.ResumeAll()
			stuck.Wait()
			require.Zero(t, failed, "%d of %d claims failed beside 2 connections stalled in their handshake; first: %v", failed, calls, first)
		})
	}
}
