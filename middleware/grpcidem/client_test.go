package grpcidem_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
)

// retryPolicy is a service config that retries UNAVAILABLE, quickly.
const retryPolicy = `{"methodConfig": [{
	"name": [{"service": "grpcidem.test.v1.Ledger"}],
	"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
		"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
}]}`

// attempt is one attempt of a call as the server received it.
type attempt struct {
	key      string
	previous []string // grpc-previous-rpc-attempts, set by grpc-go on a retry
}

// attempts records every attempt that reaches the server, before the
// idempotency interceptor.
type attempts struct {
	mu   sync.Mutex
	list []attempt
}

func (a *attempts) record(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	a.list = append(a.list, attempt{key: callKey(ctx, req.(*testpb.ChargeRequest)), previous: md.Get("grpc-previous-rpc-attempts")})
	a.mu.Unlock()
	return handler(ctx, req)
}

func (a *attempts) get() []attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]attempt(nil), a.list...)
}

// TestLostResponse: the server runs the call, but a proxy resets the
// connection before the answer leaves, so the client sees UNAVAILABLE.
// grpc-go's retry policy resends the call with the key the client
// interceptor gave it, and the client receives the replayed response: the
// effect happened once.
func TestLostResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		l := newLedger()
		var seen attempts
		var cut answerCut
		addr := serve(t, l, seen.record, cut.afterHandler, newInterceptor(t, store, prefix, nil).UnaryServerInterceptor)
		proxy := testserver.StartFaultProxy(t, addr)
		cut.proxy.Store(proxy)
		client := &grpcidem.Client{}
		c := dial(t, proxy.Addr, grpc.WithDefaultServiceConfig(retryPolicy), grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))

		// A first call opens the connection through the proxy.
		warm := charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 1})
		require.NoError(t, warm.err)

		cut.arm()
		got := charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 500})
		require.NoError(t, got.err, "the retry gets the replay")
		assert.EqualValues(t, 1, cut.cuts.Load(), "the first answer was dropped")
		assert.True(t, got.replayed(), "the answer is the replay of the lost one")
		assert.EqualValues(t, 500, got.reply.Amount)
		assert.EqualValues(t, 2, got.reply.Run, "the lost run's response: the warm-up was run 1")
		assert.EqualValues(t, 2, l.runs.Load(), "the effect happened once")

		all := seen.get()
		require.Len(t, all, 3, "the warm-up, the attempt whose answer was lost, its retry")
		lost, retry := all[1], all[2]
		assert.NotEmpty(t, lost.key)
		assert.NotEqual(t, all[0].key, lost.key, "each logical call gets its own key")
		assert.Equal(t, lost.key, retry.key, "the retry carries the same key")
		assert.Equal(t, []string{"1"}, retry.previous, "grpc-go's retry policy resent it")

		// Without a retry policy the client sees the loss itself, as
		// UNAVAILABLE, and its own retry with the same key gets the replay.
		plain := dial(t, proxy.Addr, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))
		require.NoError(t, charge(t, plain, "t", "", &testpb.ChargeRequest{Amount: 1}).err)
		cut.arm()
		lostCall := charge(t, plain, "t", "app-retry", &testpb.ChargeRequest{Amount: 700})
		assert.Equal(t, codes.Unavailable, status.Code(lostCall.err), "the answer was lost: %v", lostCall.err)
		assert.EqualValues(t, 2, cut.cuts.Load())
		appRetry := charge(t, plain, "t", "app-retry", &testpb.ChargeRequest{Amount: 700})
		require.NoError(t, appRetry.err)
		assert.True(t, appRetry.replayed())
		assert.EqualValues(t, 700, appRetry.reply.Amount)
		assert.EqualValues(t, 4, l.runs.Load(), "two warm-ups, two lost answers: each effect once")
	})
}

// TestClientRetryReusesKey: a call failing with UNAVAILABLE is resent by
// grpc-go's retry policy with the key the client interceptor gave it, and
// the retry runs the handler (the key was FAILED).
func TestClientRetryReusesKey(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		l := newLedger()
		var seen attempts
		var n atomic.Int64
		failFirst := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if n.Add(1) == 1 {
				return nil, status.Error(codes.Unavailable, "first attempt fails")
			}
			return handler(ctx, req)
		}
		addr := serve(t, l, seen.record, newInterceptor(t, store, prefix, nil).UnaryServerInterceptor, failFirst)
		client := &grpcidem.Client{}
		c := dial(t, addr, grpc.WithDefaultServiceConfig(retryPolicy), grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))

		got := charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 5})
		require.NoError(t, got.err)
		assert.False(t, got.replayed())
		all := seen.get()
		require.Len(t, all, 2)
		assert.NotEmpty(t, all[0].key)
		assert.Equal(t, all[0].key, all[1].key, "the retry carries the same key")
		assert.Equal(t, []string{"1"}, all[1].previous)
		assert.Equal(t, []string{all[0].key}, l.seenKeys(), "the handler ran once, on the retry, with that key")
	})
}

// TestClientKeys: each logical call gets a fresh key; a key set by the
// caller (WithKey, or the request's request_id) is kept; a method the
// server does not protect gets a key too, and passes.
func TestClientKeys(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		l := newLedger()
		var seen attempts
		addr := serve(t, l, seen.record, newInterceptor(t, store, prefix, nil).UnaryServerInterceptor)
		client := &grpcidem.Client{}
		c := dial(t, addr, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))
		req := &testpb.ChargeRequest{Amount: 5}

		a, b := charge(t, c, "t", "", req), charge(t, c, "t", "", req)
		require.NoError(t, a.err)
		require.NoError(t, b.err)
		assert.False(t, b.replayed(), "two logical calls, two keys, two runs")
		assert.NotEqual(t, a.reply.Key, b.reply.Key)
		assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, a.reply.Key)

		// The application's own retry: the same key twice.
		ctx := grpcidem.WithKey(metadata.AppendToOutgoingContext(t.Context(), "tenant", "t"), "app-key")
		var h1, h2 metadata.MD
		r1, err := c.Charge(ctx, req, grpc.Header(&h1))
		require.NoError(t, err)
		r2, err := c.Charge(ctx, req, grpc.Header(&h2))
		require.NoError(t, err)
		assert.Equal(t, "app-key", r1.Key)
		assert.True(t, proto.Equal(r1, r2))
		assert.Equal(t, []string{"true"}, h2.Get(grpcidem.ReplayedMetadata))

		// The request carries its own key: no metadata is added.
		withField := &testpb.ChargeRequest{RequestId: "field-key", Amount: 5}
		f := charge(t, c, "t", "", withField)
		require.NoError(t, f.err)
		assert.Equal(t, "field-key", f.reply.Key)

		// Refund gets a fresh key as well.
		refund := invoke(t, c.Refund, "t", "", req)
		require.NoError(t, refund.err)
		assert.EqualValues(t, 5, l.runs.Load())
	})
}

// answerCut loses one answer when armed: once the server's interceptor
// chain has returned, and before grpc-go writes the answer, it resets every
// connection through the proxy. The call ran; its answer is lost.
type answerCut struct {
	proxy atomic.Pointer[testserver.FaultProxy]
	armed atomic.Bool
	cuts  atomic.Int64
}

func (c *answerCut) arm() { c.armed.Store(true) }

// afterHandler is the server interceptor that cuts the connections.
func (c *answerCut) afterHandler(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if c.armed.CompareAndSwap(true, false) {
		c.cuts.Add(1) // before the reset, which the client may see at once
		c.proxy.Load().ResetAll()
	}
	return resp, err
}

// namesSeen records, for every call that reaches the server, the values of
// each metadata name in names.
type namesSeen struct {
	names []string
	mu    sync.Mutex
	calls []map[string][]string
}

func (n *namesSeen) record(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	seen := map[string][]string{}
	for _, name := range n.names {
		seen[name] = md.Get(name)
	}
	n.mu.Lock()
	n.calls = append(n.calls, seen)
	n.mu.Unlock()
	return handler(ctx, req)
}

func (n *namesSeen) get() []map[string][]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]map[string][]string(nil), n.calls...)
}

// TestWithKeyUnderCustomMetadata: the key an application sets with WithKey
// is the key the server sees, under the metadata name the Client and the
// server were configured with, whether the server reads that name alone or
// the default name besides. Before, WithKey wrote idempotency-key whatever
// the Client's name: a server reading only the custom name saw a fresh key
// on every attempt of the application's retry (the effect ran twice), and
// one reading both names refused every call (two keys that disagree).
func TestWithKeyUnderCustomMetadata(t *testing.T) {
	const custom = "x-request-key"
	for _, tc := range []struct {
		name   string
		server []string
	}{
		{"server reads the custom name", []string{custom}},
		{"server reads both names", []string{custom, "idempotency-key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) {
				store, prefix := kind.New(t)
				l := newLedger()
				seen := &namesSeen{names: []string{custom, "idempotency-key"}}
				addr := serve(t, l, seen.record, newInterceptor(t, store, prefix, func(c *config) { c.Metadata = tc.server }).UnaryServerInterceptor)
				client := &grpcidem.Client{Metadata: custom}
				c := dial(t, addr, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))

				// The application retries one logical call itself.
				ctx := grpcidem.WithKey(metadata.AppendToOutgoingContext(t.Context(), "tenant", "t"), "app-key")
				req := &testpb.ChargeRequest{Amount: 5}
				var h1, h2 metadata.MD
				r1, err := c.Charge(ctx, req, grpc.Header(&h1))
				require.NoError(t, err, "the first attempt")
				r2, err := c.Charge(ctx, req, grpc.Header(&h2))
				require.NoError(t, err, "the application's retry")
				assert.True(t, proto.Equal(r1, r2), "the retry gets the first answer")
				assert.Empty(t, h1.Get(grpcidem.ReplayedMetadata))
				assert.Equal(t, []string{"true"}, h2.Get(grpcidem.ReplayedMetadata), "the retry is a replay")
				assert.EqualValues(t, 1, l.runs.Load(), "the effect ran once")

				calls := seen.get()
				require.Len(t, calls, 2)
				for i, call := range calls {
					assert.Equal(t, []string{"app-key"}, call[custom], "attempt %d carries the application's key under %s", i+1, custom)
					assert.Empty(t, call["idempotency-key"], "attempt %d: nothing under the name the client was not configured with", i+1)
				}

				// A key set with WithKey is sent for every method.
				refundCtx := grpcidem.WithKey(metadata.AppendToOutgoingContext(t.Context(), "tenant", "t"), "refund-key")
				_, err = c.Refund(refundCtx, req)
				require.NoError(t, err)
				_, err = c.Refund(refundCtx, req)
				require.NoError(t, err)
				assert.EqualValues(t, 2, l.runs.Load(), "the refund ran once")
				calls = seen.get()
				require.Len(t, calls, 4)
				assert.Equal(t, []string{"refund-key"}, calls[3][custom])
			})
		})
	}
}

// TestWithKeyConflictsWithOutgoingMetadata: a WithKey key that differs from
// one the application put under the client's metadata name itself is
// refused before the call is sent; the same key passes.
func TestWithKeyConflictsWithOutgoingMetadata(t *testing.T) {
	l := newLedger()
	var seen attempts
	store, prefix := storeKinds[0].New(t)
	addr := serve(t, l, seen.record, newInterceptor(t, store, prefix, nil).UnaryServerInterceptor)
	client := &grpcidem.Client{}
	c := dial(t, addr, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor))
	base := metadata.AppendToOutgoingContext(t.Context(), "tenant", "t", "idempotency-key", "md-key")

	_, err := c.Charge(grpcidem.WithKey(base, "other-key"), &testpb.ChargeRequest{Amount: 5})
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.Empty(t, seen.get(), "the conflicting call was not sent")

	r, err := c.Charge(grpcidem.WithKey(base, "md-key"), &testpb.ChargeRequest{Amount: 5})
	require.NoError(t, err)
	assert.Equal(t, "md-key", r.Key)
	require.Len(t, seen.get(), 1)
}

// TestWithKeyWithoutClientInterceptor: on a connection without a Client's
// interceptor, a key set with WithKey still reaches the server, under
// defaultMetadata: an application's own retry of one logical call is
// answered with the replay, whether the server requires a key or lets
// calls without one pass (KeyOptional, where a key that is not sent leaves
// the retry to run the handler again). Two WithKey calls: the last wins.
func TestWithKeyWithoutClientInterceptor(t *testing.T) {
	for _, optional := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeyOptional=%v", optional), func(t *testing.T) {
			l := newLedger()
			seen := &namesSeen{names: []string{"idempotency-key"}}
			store, prefix := storeKinds[0].New(t)
			addr := serve(t, l, seen.record, newInterceptor(t, store, prefix, func(c *config) { c.KeyOptional = optional }).UnaryServerInterceptor)
			c := dial(t, addr) // no Client interceptor

			ctx := grpcidem.WithKey(grpcidem.WithKey(metadata.AppendToOutgoingContext(t.Context(), "tenant", "t"), "first-key"), "app-key")
			req := &testpb.ChargeRequest{Amount: 5}
			var h2 metadata.MD
			_, err := c.Charge(ctx, req)
			require.NoError(t, err, "the first attempt")
			_, err = c.Charge(ctx, req, grpc.Header(&h2))
			require.NoError(t, err, "the application's retry")
			assert.Equal(t, []string{"true"}, h2.Get(grpcidem.ReplayedMetadata), "the retry is a replay")
			assert.EqualValues(t, 1, l.runs.Load(), "the effect ran once")
			for i, call := range seen.get() {
				assert.Equal(t, []string{"app-key"}, call["idempotency-key"], "attempt %d", i+1)
			}
		})
	}
}
