package grpcidem_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
)

const (
	methodCharge = "/grpcidem.test.v1.Ledger/Charge"
	methodRefund = "/grpcidem.test.v1.Ledger/Refund"
)

// storeKind builds a fresh store for one test, and a key prefix unique to it.
type storeKind = adaptertest.StoreKind

var storeKinds = adaptertest.StoreKinds("grpcidem", "grpcidemtest")

// eachStore runs f once per store kind, in parallel.
func eachStore(t *testing.T, f func(t *testing.T, kind storeKind)) {
	for _, k := range storeKinds {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			f(t, k)
		})
	}
}

// ledger is the service under test. What a call does depends on its
// request: answer with req.Code (and details), panic, block until released,
// or answer OK with req.ReplySize bytes of padding.
type ledger struct {
	testpb.UnimplementedLedgerServer
	runs    atomic.Int64
	started chan string
	release chan struct{}

	mu   sync.Mutex
	keys []string // the key each run saw, in order
}

func newLedger() *ledger {
	return &ledger{started: make(chan string, 64), release: make(chan struct{})}
}

// callKey is the key a handler sees: the metadata's, else the field's.
func callKey(ctx context.Context, req *testpb.ChargeRequest) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("idempotency-key"); len(v) > 0 {
		return v[0]
	}
	return req.GetRequestId()
}

func (l *ledger) handle(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeReply, error) {
	n := l.runs.Add(1)
	key := callKey(ctx, req)
	l.mu.Lock()
	l.keys = append(l.keys, key)
	l.mu.Unlock()
	if req.Panic {
		panic("ledger panics")
	}
	if req.Block {
		l.started <- key
		select {
		case <-l.release:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if req.Code != 0 {
		st := status.New(codes.Code(req.Code), fmt.Sprintf("run %d answers %s", n, codes.Code(req.Code)))
		if req.WithDetails {
			var err error
			st, err = st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: "amount", Description: fmt.Sprintf("rejected by run %d", n)},
			}})
			if err != nil {
				return nil, err
			}
		}
		return nil, st.Err()
	}
	return &testpb.ChargeReply{Run: n, Amount: req.Amount, Key: key, Padding: make([]byte, req.ReplySize)}, nil
}

func (l *ledger) Charge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeReply, error) {
	return l.handle(ctx, req)
}

func (l *ledger) Refund(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeReply, error) {
	return l.handle(ctx, req)
}

func (l *ledger) Peek(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeReply, error) {
	return l.handle(ctx, req)
}

func (l *ledger) Watch(req *testpb.ChargeRequest, stream grpc.ServerStreamingServer[testpb.ChargeReply]) error {
	n := l.runs.Add(1)
	for i := range 2 {
		if err := stream.Send(&testpb.ChargeReply{Run: n, Amount: int64(i)}); err != nil {
			return err
		}
	}
	return nil
}

func (l *ledger) seenKeys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// recoverPanics is the outer recovery interceptor a real server has: a
// panic becomes INTERNAL.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

// tenantScope scopes keys by the "tenant" metadata, as an authenticated
// subject would.
func tenantScope(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("tenant"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// config is what a test sets: the Once's settings and the interceptor's.
type config struct {
	idempotency.OnceConfig
	grpcidem.Config
}

// build returns the interceptor of cfg, on a Once of its own.
func build(cfg config) (*grpcidem.Middleware, error) {
	once, err := idempotency.NewOnce(cfg.OnceConfig)
	if err != nil {
		return nil, err
	}
	return grpcidem.New(once, &cfg.Config)
}

// newInterceptor builds an interceptor for Charge and Refund on store, with
// the test's prefix and tenant scope; adjust may change the config first.
func newInterceptor(t testing.TB, store idempotency.Store, prefix string, adjust func(*config)) *grpcidem.Middleware {
	t.Helper()
	cfg := config{OnceConfig: idempotency.OnceConfig{Store: store},
		Config: grpcidem.Config{KeyPrefix: prefix, Scope: tenantScope, Methods: []string{methodCharge, methodRefund}}}
	if adjust != nil {
		adjust(&cfg)
	}
	i, err := build(cfg)
	require.NoError(t, err)
	return i
}

// serve runs a real gRPC server for svc on loopback TCP, behind the
// recovery interceptor, the interceptors given, and returns its address.
func serve(t testing.TB, svc testpb.LedgerServer, interceptors ...grpc.UnaryServerInterceptor) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{recoverPanics}, interceptors...)...))
	testpb.RegisterLedgerServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// dial connects to addr without TLS.
func dial(t testing.TB, addr string, opts ...grpc.DialOption) testpb.LedgerClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return testpb.NewLedgerClient(conn)
}

// setup is a server with the interceptor on a store of kind, and a client.
func setup(t *testing.T, kind storeKind, adjust func(*config)) (*ledger, testpb.LedgerClient) {
	t.Helper()
	store, prefix := kind.New(t)
	l := newLedger()
	addr := serve(t, l, newInterceptor(t, store, prefix, adjust).UnaryServerInterceptor)
	return l, dial(t, addr)
}

// answer is one call's outcome as the client saw it.
type answer struct {
	reply  *testpb.ChargeReply
	err    error
	header metadata.MD
}

func (a answer) replayed() bool { return a.header.Get(grpcidem.ReplayedMetadata) != nil }

// charge calls Charge with the key in the metadata (none when key is
// empty) as tenant.
func charge(t testing.TB, c testpb.LedgerClient, tenant, key string, req *testpb.ChargeRequest) answer {
	t.Helper()
	return invoke(t, c.Charge, tenant, key, req)
}

func invoke(t testing.TB, method func(context.Context, *testpb.ChargeRequest, ...grpc.CallOption) (*testpb.ChargeReply, error),
	tenant, key string, req *testpb.ChargeRequest) answer {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", tenant)
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
	}
	var a answer
	a.reply, a.err = method(ctx, req, grpc.Header(&a.header))
	return a
}

// reasonKind is an answer of the interceptor that the tests tell apart:
// its ErrorInfo reason (the outcome in upper case) and a part of its
// message.
type reasonKind struct{ reason, msg string }

var (
	keyMissing        = reasonKind{"MISSING_KEY", "requires an idempotency key"}
	keyInvalid        = reasonKind{"MISSING_KEY", "The idempotency key in"}
	keyReused         = reasonKind{"KEY_REUSED", "first used for a different call"}
	inProgress        = reasonKind{"IN_PROGRESS", "is still running"}
	tooManyAttempts   = reasonKind{"TOO_MANY_ATTEMPTS", "failed too many times"}
	recordCorrupt     = reasonKind{"CORRUPT_RECORD", "cannot be read"}
	responseNotStored = reasonKind{"OUTPUT_NOT_STORED", "too large to store"}
	storeUnavailable  = reasonKind{"STORE_UNAVAILABLE", "store cannot be reached"}
	notProtoMessage   = reasonKind{"NOT_PROTO_MESSAGE", "protocol buffers"}
)

// requireReason checks that err is code with the interceptor's ErrorInfo
// of kind, and returns its status.
func requireReason(t testing.TB, err error, code codes.Code, kind reasonKind) *status.Status {
	t.Helper()
	require.Error(t, err)
	st := status.Convert(err)
	require.Equal(t, code, st.Code(), st.Message())
	info := errorInfo(st)
	require.NotNil(t, info, "the interceptor's own answers carry an ErrorInfo: %v", st.Details())
	assert.Equal(t, grpcidem.ErrorDomain, info.Domain)
	assert.Equal(t, kind.reason, info.Reason)
	assert.Contains(t, st.Message(), kind.msg)
	return st
}

// clientErr returns the error a call through c's interceptor fails with
// before anything is sent, nil when it would be sent.
func clientErr(c *grpcidem.Client) error {
	return c.UnaryClientInterceptor(context.Background(), methodCharge, &testpb.ChargeRequest{}, nil, nil,
		func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil })
}

func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func retryInfo(st *status.Status) *errdetails.RetryInfo {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	return nil
}
