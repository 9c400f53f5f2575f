package grpcidem_test

import (
	"context"
	"io"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestReplay: the first call runs, a repeat gets the same response, marked
// with the header idempotent-replayed: true, and the handler does not run
// again; with the key in the metadata and in the request's request_id.
func TestReplay(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, nil)

		first := charge(t, c, "alice", "k1", &testpb.ChargeRequest{Amount: 100})
		require.NoError(t, first.err)
		assert.EqualValues(t, 1, first.reply.Run)
		assert.False(t, first.replayed(), "a first call is not a replay")
		again := charge(t, c, "alice", "k1", &testpb.ChargeRequest{Amount: 100})
		require.NoError(t, again.err)
		assert.True(t, proto.Equal(first.reply, again.reply), "replay %v, first %v", again.reply, first.reply)
		assert.Equal(t, []string{"true"}, again.header.Get(grpcidem.ReplayedMetadata))
		assert.EqualValues(t, 1, l.runs.Load())

		// AIP-155: the key in the request message itself.
		req := &testpb.ChargeRequest{RequestId: "rid-1", Amount: 7}
		byField := charge(t, c, "alice", "", req)
		require.NoError(t, byField.err)
		assert.EqualValues(t, 2, byField.reply.Run)
		assert.Equal(t, "rid-1", byField.reply.Key)
		again = charge(t, c, "alice", "", req)
		require.NoError(t, again.err)
		assert.True(t, again.replayed())
		assert.True(t, proto.Equal(byField.reply, again.reply))
		// The same key in the metadata too is the same call.
		again = charge(t, c, "alice", "rid-1", req)
		require.NoError(t, again.err)
		assert.True(t, again.replayed())
		assert.EqualValues(t, 2, l.runs.Load())
	})
}

// TestPassThrough: a method outside Config.Methods and a streaming method
// run every time, with or without a key, and are never replayed.
func TestPassThrough(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, nil)
		for i := range 2 {
			a := invoke(t, c.Peek, "alice", "k1", &testpb.ChargeRequest{Amount: 1})
			require.NoError(t, a.err)
			assert.EqualValues(t, i+1, a.reply.Run)
			assert.False(t, a.replayed())
		}
		a := invoke(t, c.Peek, "alice", "", &testpb.ChargeRequest{})
		require.NoError(t, a.err, "no key is needed outside Methods")

		for range 2 {
			ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "k1")
			stream, err := c.Watch(ctx, &testpb.ChargeRequest{})
			require.NoError(t, err)
			n := 0
			for {
				_, err := stream.Recv()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
				n++
			}
			assert.Equal(t, 2, n, "the stream is untouched")
		}
		assert.EqualValues(t, 5, l.runs.Load(), "3 unary calls outside Methods, 2 streams: every one ran")
	})
}

// TestTenantIsolation: two scopes using the same key each run once and
// never see the other's response.
func TestTenantIsolation(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, nil)
		alice := charge(t, c, "alice", "shared", &testpb.ChargeRequest{Amount: 100})
		bob := charge(t, c, "bob", "shared", &testpb.ChargeRequest{Amount: 100})
		require.NoError(t, alice.err)
		require.NoError(t, bob.err)
		assert.False(t, bob.replayed(), "bob's call runs: alice's key is not his")
		assert.NotEqual(t, alice.reply.Run, bob.reply.Run)

		// Bob may even send another request under the same key.
		bob2 := charge(t, c, "bob2", "shared", &testpb.ChargeRequest{Amount: 999})
		require.NoError(t, bob2.err)
		assert.False(t, bob2.replayed())

		for tenant, want := range map[string]answer{"alice": alice, "bob": bob} {
			again := charge(t, c, tenant, "shared", &testpb.ChargeRequest{Amount: 100})
			require.NoError(t, again.err)
			assert.True(t, again.replayed())
			assert.True(t, proto.Equal(want.reply, again.reply), "%s gets its own response back", tenant)
		}
		assert.EqualValues(t, 3, l.runs.Load())
	})
}

// TestKeyReused: the same key with another request message, or for another
// method, is FAILED_PRECONDITION; the key's first answer stays stored.
func TestKeyReused(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, nil)
		first := charge(t, c, "alice", "k1", &testpb.ChargeRequest{Amount: 100})
		require.NoError(t, first.err)

		other := charge(t, c, "alice", "k1", &testpb.ChargeRequest{Amount: 250})
		requireReason(t, other.err, codes.FailedPrecondition, keyReused)
		assert.False(t, other.replayed())
		refund := invoke(t, c.Refund, "alice", "k1", &testpb.ChargeRequest{Amount: 100})
		requireReason(t, refund.err, codes.FailedPrecondition, keyReused)

		again := charge(t, c, "alice", "k1", &testpb.ChargeRequest{Amount: 100})
		require.NoError(t, again.err)
		assert.True(t, proto.Equal(first.reply, again.reply))
		assert.EqualValues(t, 1, l.runs.Load())
	})
}

// TestConfig: New refuses what cannot work, with ErrInvalidConfig; the
// Once refuses its own settings.
func TestConfig(t *testing.T) {
	store := &struct{ idempotency.Store }{}
	ok := config{OnceConfig: idempotency.OnceConfig{Store: store}, Config: grpcidem.Config{Scope: tenantScope, Methods: []string{methodCharge}}}
	_, err := build(ok)
	require.NoError(t, err)

	_, err = build(config{Config: grpcidem.Config{Scope: tenantScope, Methods: []string{methodCharge}}})
	assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, "the Once needs a Store")
	for name, adjust := range map[string]func(*config){
		"no scope":         func(c *config) { c.Scope = nil },
		"scope and single": func(c *config) { c.SingleTenant = true },
		"no methods":       func(c *config) { c.Methods = nil },
		"short method":     func(c *config) { c.Methods = []string{"Charge"} },
		"method no slash":  func(c *config) { c.Methods = []string{"grpcidem.test.v1.Ledger/Charge"} },
		"metadata grpc-":   func(c *config) { c.Metadata = []string{"grpc-key"} },
		"metadata -bin":    func(c *config) { c.Metadata = []string{"key-bin"} },
		"metadata upper":   func(c *config) { c.Metadata = []string{"Idempotency-Key"} },
		"negative retry":   func(c *config) { c.RetryAfter = -1 },
		"prefix separator": func(c *config) { c.KeyPrefix = "shop:billing" },
	} {
		cfg := ok
		adjust(&cfg)
		_, err := build(cfg)
		assert.ErrorIs(t, err, grpcidem.ErrInvalidConfig, name)
	}
	for name, adjust := range map[string]func(*config){
		"negative lease":    func(c *config) { c.LeaseTTL = -1 },
		"tiny lease":        func(c *config) { c.LeaseTTL = 1 },
		"negative max size": func(c *config) { c.MaxOutputSize = -1 },
		"forever completed": func(c *config) { c.CompletedTTL = time.Duration(math.MaxInt64) },
		"forever failed":    func(c *config) { c.FailedTTL = idempotency.MaxTTL + 1 },
		"forever lease":     func(c *config) { c.LeaseTTL = time.Duration(math.MaxInt64) },
	} {
		cfg := ok
		adjust(&cfg)
		_, err := build(cfg)
		assert.ErrorIs(t, err, idempotency.ErrInvalidConfig, name)
	}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	// Every problem at once, in the documented order, each an
	// ErrInvalidConfig.
	_, err = grpcidem.New(once, &grpcidem.Config{Metadata: []string{"grpc-key", "Key"}})
	adaptertest.RequireProblems(t, err, `grpcidem: invalid config: Scope is required (the tenant of a call); set SingleTenant instead only when one client calls this service
grpcidem: invalid config: Methods is required: the full names of the unary methods to make idempotent
grpcidem: invalid config: metadata key "grpc-key" cannot carry a key (empty, reserved grpc- or binary -bin)
grpcidem: invalid config: metadata key "Key" must be lower-case letters, digits, '-', '_' or '.'`, grpcidem.ErrInvalidConfig, nil)
	_, err = grpcidem.New(once, nil)
	adaptertest.RequireProblems(t, err, `grpcidem: invalid config: Scope is required (the tenant of a call); set SingleTenant instead only when one client calls this service
grpcidem: invalid config: Methods is required: the full names of the unary methods to make idempotent`, grpcidem.ErrInvalidConfig, nil)
	_, err = grpcidem.New(nil, &ok.Config)
	assert.ErrorIs(t, err, grpcidem.ErrInvalidConfig, "a nil Once")
	err = clientErr(&grpcidem.Client{Metadata: "Bad"})
	adaptertest.RequireProblems(t, err, `grpcidem: invalid config: metadata key "Bad" must be lower-case letters, digits, '-', '_' or '.'`, grpcidem.ErrInvalidConfig, nil)

	single := ok
	single.Scope, single.SingleTenant = nil, true
	_, err = build(single)
	assert.NoError(t, err)

	err = clientErr(&grpcidem.Client{Metadata: "Bad Name"})
	assert.ErrorIs(t, err, grpcidem.ErrInvalidConfig)
	err = clientErr(&grpcidem.Client{})
	assert.NoError(t, err)
}

// recordingObserver keeps every outcome with its label.
type recordingObserver struct {
	mu       sync.Mutex
	outcomes []string
}

func (o *recordingObserver) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, d.Handler+" "+string(d.Outcome))
}

func (o *recordingObserver) StoreLatency(string, time.Duration, error) {}

func (o *recordingObserver) CacheLookup(string, bool) {}

// TestObserver: one outcome per call the interceptor applies to, labelled
// with the full method name, never the scope; none for other methods.
func TestObserver(t *testing.T) {
	obs := &recordingObserver{}
	_, c := setup(t, storeKinds[0], func(cfg *config) { cfg.Observer = obs })
	req := &testpb.ChargeRequest{Amount: 1}
	charge(t, c, "alice", "k1", req)
	charge(t, c, "alice", "k1", req)
	charge(t, c, "alice", "k1", &testpb.ChargeRequest{Amount: 2})
	charge(t, c, "alice", "", req)
	charge(t, c, "alice", "k2", &testpb.ChargeRequest{Amount: 1, Code: int32(codes.Unavailable)})
	invoke(t, c.Peek, "alice", "k3", req)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	assert.Equal(t, []string{
		methodCharge + " processed", methodCharge + " duplicate", methodCharge + " key_reused",
		methodCharge + " missing_key", methodCharge + " handler_failed",
	}, obs.outcomes)
}

// TestConfigRefusesStreamingMethods: a streaming method in Methods would
// pass through unprotected (no unary interceptor sees its calls), and so
// would a method its registered service does not have: New refuses
// both, as the protobuf registry describes the service. A method of
// a service the registry does not know is taken as written.
func TestConfigRefusesStreamingMethods(t *testing.T) {
	const methodWatch = "/grpcidem.test.v1.Ledger/Watch"
	ok := config{OnceConfig: idempotency.OnceConfig{Store: &struct{ idempotency.Store }{}}, Config: grpcidem.Config{Scope: tenantScope}}

	cfg := ok
	cfg.Methods = []string{methodCharge, methodWatch, "/grpcidem.test.v1.Ledger/Chrage", "/unknown.v1.Service/Call"}
	_, err := build(cfg)
	adaptertest.RequireProblems(t, err, `grpcidem: invalid config: method "/grpcidem.test.v1.Ledger/Watch" streams: only unary methods can be made idempotent, and its calls would pass through unprotected
grpcidem: invalid config: method "/grpcidem.test.v1.Ledger/Chrage" is not a method of its service, as its registered descriptor has it`, grpcidem.ErrInvalidConfig, nil)

	cfg.Methods = []string{methodCharge, "/unknown.v1.Service/Call"}
	_, err = build(cfg)
	assert.NoError(t, err, "a service the registry does not know is taken as written")
}

// TestNotProtoMessage: a request that is not a protocol buffers message
// cannot be fingerprinted: INTERNAL with reason NOT_PROTO_MESSAGE, and the
// handler never runs.
func TestNotProtoMessage(t *testing.T) {
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil)})
	require.NoError(t, err)
	const method = "/ledger.Ledger/Charge"
	idem, err := grpcidem.New(once, &grpcidem.Config{SingleTenant: true, Methods: []string{method}})
	require.NoError(t, err)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k1"))
	ran := false
	_, err = idem.UnaryServerInterceptor(ctx, "not a message", &grpc.UnaryServerInfo{FullMethod: method},
		func(context.Context, any) (any, error) { ran = true; return nil, nil })
	requireReason(t, err, codes.Internal, notProtoMessage)
	assert.False(t, ran, "the handler must not run")
}
