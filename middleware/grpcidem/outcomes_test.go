package grpcidem_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
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
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestStatusMapping is the table of the package documentation, one row at a
// time (each row's own test is named in it):
//
//	a retry while the first call runs  ABORTED + RetryInfo   TestInProgress
//	the same key, a different request  FAILED_PRECONDITION   TestKeyReused
//	store down                         UNAVAILABLE / runs    TestStoreUnavailable
//	retryable codes, or a panic        FAILED, runs again    here: "retryable"
//	any other code                     COMPLETED, replayed   here: "completed"
func TestStatusMapping(t *testing.T) {
	retryable := []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded,
		codes.ResourceExhausted, codes.Aborted, codes.Canceled}
	completed := []codes.Code{codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.DataLoss, codes.Unauthenticated}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		assert.Equal(t, grpcidem.Retryable(c), containsCode(retryable, c), "Retryable(%s)", c)
	}
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, nil)
		t.Run("retryable", func(t *testing.T) {
			for _, code := range retryable {
				key := "retry-" + code.String()
				req := &testpb.ChargeRequest{Amount: 1, Code: int32(code)}
				before := l.runs.Load()
				first := charge(t, c, "t", key, req)
				assert.Equal(t, code, status.Code(first.err), "%s goes to the caller", code)
				again := charge(t, c, "t", key, req)
				assert.Equal(t, code, status.Code(again.err))
				assert.False(t, again.replayed(), "%s is not replayed", code)
				assert.EqualValues(t, before+2, l.runs.Load(), "%s leaves the key FAILED: the retry runs again", code)
			}
		})
		t.Run("panic", func(t *testing.T) {
			req := &testpb.ChargeRequest{Amount: 1, Panic: true}
			before := l.runs.Load()
			for range 2 {
				a := charge(t, c, "t", "panics", req)
				assert.Equal(t, codes.Internal, status.Code(a.err), "the outer recovery answers the panic")
				assert.Contains(t, status.Convert(a.err).Message(), "ledger panics")
				assert.False(t, a.replayed())
			}
			assert.EqualValues(t, before+2, l.runs.Load(), "a panic leaves the key FAILED")
		})
		t.Run("completed", func(t *testing.T) {
			for _, code := range completed {
				for _, details := range []bool{false, true} {
					key := fmt.Sprintf("done-%s-%v", code, details)
					req := &testpb.ChargeRequest{Amount: 1, Code: int32(code), WithDetails: details}
					before := l.runs.Load()
					first := charge(t, c, "t", key, req)
					require.Equal(t, code, status.Code(first.err))
					again := charge(t, c, "t", key, req)
					assert.True(t, again.replayed(), "%s is replayed", code)
					want, got := status.Convert(first.err), status.Convert(again.err)
					assert.True(t, proto.Equal(want.Proto(), got.Proto()), "%s: replayed %v, first %v", code, got.Proto(), want.Proto())
					if details {
						require.Len(t, got.Details(), 1, "the handler's details are replayed")
					}
					assert.EqualValues(t, before+1, l.runs.Load(), "%s: COMPLETED, the handler ran once", code)
				}
			}
			// OK is completed too (TestReplay has more).
			first := charge(t, c, "t", "done-OK", &testpb.ChargeRequest{Amount: 1})
			again := charge(t, c, "t", "done-OK", &testpb.ChargeRequest{Amount: 1})
			require.NoError(t, again.err)
			assert.True(t, again.replayed())
			assert.True(t, proto.Equal(first.reply, again.reply))
		})
	})
}

func containsCode(cs []codes.Code, c codes.Code) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

// TestInProgress: a retry while the first call runs is ABORTED, with a
// RetryInfo detail and the pushback trailer, and does not run the handler;
// once the first call is done, the retry gets its replay.
func TestInProgress(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		l, c := setup(t, kind, func(cfg *config) { cfg.RetryAfter = 1500 * time.Millisecond })
		req := &testpb.ChargeRequest{Amount: 1, Block: true}
		done := make(chan answer, 1)
		go func() { done <- charge(t, c, "t", "busy", req) }()
		<-l.started

		var trailer metadata.MD
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", "t", "idempotency-key", "busy")
		_, err := c.Charge(ctx, req, grpc.Trailer(&trailer))
		st := requireReason(t, err, codes.Aborted, inProgress)
		ri := retryInfo(st)
		require.NotNil(t, ri, "ABORTED carries a RetryInfo")
		assert.Equal(t, 1500*time.Millisecond, ri.RetryDelay.AsDuration())
		assert.Equal(t, []string{"1500"}, trailer.Get("grpc-retry-pushback-ms"))

		close(l.release)
		first := <-done
		require.NoError(t, first.err)
		again := charge(t, c, "t", "busy", req)
		require.NoError(t, again.err)
		assert.True(t, again.replayed())
		assert.True(t, proto.Equal(first.reply, again.reply))
		assert.EqualValues(t, 1, l.runs.Load())
	})
}

// TestStoreUnavailable: with the store down, calls are UNAVAILABLE with a
// RetryInfo and the handler does not run (fail closed); with FailOpen the
// handler runs every time, and each unprotected run is logged.
func TestStoreUnavailable(t *testing.T) {
	for _, ds := range adaptertest.DownStores {
		t.Run(ds.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("fail closed", func(t *testing.T) {
				t.Parallel()
				l := newLedger()
				c := dial(t, serve(t, l, newInterceptor(t, ds.New(t), "", nil).UnaryServerInterceptor))
				for range 2 {
					a := charge(t, c, "t", "k1", &testpb.ChargeRequest{Amount: 1})
					st := requireReason(t, a.err, codes.Unavailable, storeUnavailable)
					assert.NotNil(t, retryInfo(st))
				}
				assert.Zero(t, l.runs.Load(), "the handler must not run without the store")
			})
			t.Run("fail open", func(t *testing.T) {
				t.Parallel()
				l := newLedger()
				logger := watermill.NewCaptureLogger()
				i, err := build(config{OnceConfig: idempotency.OnceConfig{Store: ds.New(t), FailOpen: true, Logger: logger}, Config: grpcidem.Config{SingleTenant: true, Methods: []string{methodCharge}}})
				require.NoError(t, err)
				c := dial(t, serve(t, l, i.UnaryServerInterceptor))
				for n := range 2 {
					a := charge(t, c, "t", "k1", &testpb.ChargeRequest{Amount: 1})
					require.NoError(t, a.err)
					assert.EqualValues(t, n+1, a.reply.Run)
				}
				assert.EqualValues(t, 2, l.runs.Load(), "fail open runs every call")
				assert.Len(t, logger.Captured()[watermill.ErrorLogLevel], 2, "each unprotected run is logged")
			})
		})
	}
}

// TestCorruptRecord: a foreign value under the very key a call is stored at
// is INTERNAL (ReasonRecordCorrupt), never replayed, never overwritten, and
// the handler does not run; so is a COMPLETED record whose stored answer
// cannot be read.
func TestCorruptRecord(t *testing.T) {
	t.Parallel()
	t.Run("redis foreign value", func(t *testing.T) {
		t.Parallel()
		client := testserver.RedisClient(t)
		store, err := redisstore.New(client, nil)
		require.NoError(t, err)
		prefix := "grpcidemtest-" + adaptertest.RandomHex(t)
		skey := grpcidem.StoreKey(prefix, "t", "k1")
		ctx := context.Background()
		t.Cleanup(func() { _ = client.Del(ctx, skey).Err() })
		require.NoError(t, client.Set(ctx, skey, `{"state":"completed"}`, 0).Err())

		l := newLedger()
		logger := watermill.NewCaptureLogger()
		i, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store, Logger: logger}, Config: grpcidem.Config{KeyPrefix: prefix, Scope: tenantScope, Methods: []string{methodCharge}}})
		require.NoError(t, err)
		c := dial(t, serve(t, l, i.UnaryServerInterceptor))
		a := charge(t, c, "t", "k1", &testpb.ChargeRequest{Amount: 1})
		requireReason(t, a.err, codes.Internal, recordCorrupt)
		assert.False(t, a.replayed())
		assert.Equal(t, `{"state":"completed"}`, client.Get(ctx, skey).Val(), "the foreign value is left as it was")
		assert.Zero(t, l.runs.Load())
		errs := logger.Captured()[watermill.ErrorLogLevel]
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0].Err, idempotency.ErrCorruptRecord)
		assert.Equal(t, skey, errs[0].Fields["idempotency_key"], "logged with the stored key")
	})
	t.Run("unreadable stored answer", func(t *testing.T) {
		t.Parallel()
		for name, result := range map[string][]byte{
			"garbage":      []byte("not an answer"),
			"unknown type": append([]byte{1, 1, 11}, append([]byte("no.Such.Msg"), 0)...),
			"wrong type":   append([]byte{1, 1, 21}, append([]byte("google.rpc.ErrorInfo"), 0)...),
			"empty":        {},
		} {
			store := memstore.New(nil)
			skey := grpcidem.StoreKey("grpcidem", "t", "k1")
			ctx := context.Background()
			_, err := store.Claim(ctx, skey, idempotency.ClaimRequest{Token: "tok", Lease: time.Minute, TTL: time.Minute})
			require.NoError(t, err)
			require.NoError(t, store.Complete(ctx, skey, "tok", result, time.Minute))

			l := newLedger()
			c := dial(t, serve(t, l, newInterceptor(t, store, "", nil).UnaryServerInterceptor))
			a := charge(t, c, "t", "k1", &testpb.ChargeRequest{Amount: 1})
			requireReason(t, a.err, codes.Internal, recordCorrupt)
			assert.Zero(t, l.runs.Load(), name)
		}
	})
}

// TestCallerGone: a caller whose deadline passes while its claim waits on
// the store is counted caller_gone and logged below Error, not
// store_unavailable, which tells an operator that the store fails; a caller
// that waits out StoreTimeout is store_unavailable. Nothing runs for either.
func TestCallerGone(t *testing.T) {
	store := adaptertest.PartitionedStore(t)
	l := newLedger()
	obs := &recordingObserver{}
	logger := watermill.NewCaptureLogger()
	served := make(chan struct{}, 1)
	signal := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		defer func() { served <- struct{}{} }() // the outcome is counted
		return handler(ctx, req)
	}
	client := func(storeTimeout time.Duration) testpb.LedgerClient {
		i, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store, Observer: obs, StoreTimeout: storeTimeout, Logger: logger}, Config: grpcidem.Config{SingleTenant: true, Methods: []string{methodCharge}}})
		require.NoError(t, err)
		return dial(t, serve(t, l, signal, i.UnaryServerInterceptor))
	}

	// The caller's deadline ends long before StoreTimeout could.
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "gave-up"), 100*time.Millisecond)
	defer cancel()
	_, err := client(2*time.Second).Charge(ctx, &testpb.ChargeRequest{Amount: 1})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	<-served
	obs.mu.Lock()
	assert.Equal(t, []string{methodCharge + " caller_gone"}, obs.outcomes)
	obs.mu.Unlock()
	assert.Empty(t, logger.Captured()[watermill.ErrorLogLevel], "no operator needs to hear of it")

	// A caller without a deadline waits out StoreTimeout.
	a := charge(t, client(200*time.Millisecond), "t", "waited", &testpb.ChargeRequest{Amount: 1})
	<-served
	requireReason(t, a.err, codes.Unavailable, storeUnavailable)
	obs.mu.Lock()
	assert.Equal(t, []string{methodCharge + " caller_gone", methodCharge + " store_unavailable"}, obs.outcomes)
	obs.mu.Unlock()
	assert.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1, "store_unavailable is logged at Error")
	assert.Zero(t, l.runs.Load())
}

// TestStoreTimeoutBeforeCallerDeadline: a call whose claim StoreTimeout cut
// while its caller still waited is store_unavailable, also when the
// caller's deadline passes while the failed claim is released.
func TestStoreTimeoutBeforeCallerDeadline(t *testing.T) {
	store := adaptertest.PartitionedStore(t)
	l := newLedger()
	obs := &recordingObserver{}
	served := make(chan struct{}, 1)
	signal := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		defer func() { served <- struct{}{} }() // the outcome is counted
		return handler(ctx, req)
	}
	i, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store, Observer: obs, StoreTimeout: time.Second}, Config: grpcidem.Config{SingleTenant: true, Methods: []string{methodCharge}}})
	require.NoError(t, err)
	c := dial(t, serve(t, l, signal, i.UnaryServerInterceptor))
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "store-timeout"), 1500*time.Millisecond)
	defer cancel()
	_, _ = c.Charge(ctx, &testpb.ChargeRequest{Amount: 1})
	<-served
	obs.mu.Lock()
	assert.Equal(t, []string{methodCharge + " store_unavailable"}, obs.outcomes)
	obs.mu.Unlock()
	assert.Zero(t, l.runs.Load())
}
