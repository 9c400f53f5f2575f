package idemotel_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/idemotel"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// health answers Check for the service "broken" with UNAVAILABLE (a
// retryable code: the key is FAILED) and SERVING for any other.
type health struct {
	healthpb.UnimplementedHealthServer
}

func (health) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.GetService() == "broken" {
		return nil, status.Error(codes.Unavailable, "broken on purpose")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// grpcidem puts the attributes on the server span of otelgrpc's stats
// handler, over a real gRPC server on loopback TCP.
func TestGRPCServerSpan(t *testing.T) {
	tel := newTelemetry(t, "")
	const method = "/grpc.health.v1.Health/Check"
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil), Observer: tel.obs})
	require.NoError(t, err)
	idem, err := grpcidem.New(once, &grpcidem.Config{SingleTenant: true, Methods: []string{method}})
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tel.tp))),
		grpc.ChainUnaryInterceptor(idem.UnaryServerInterceptor))
	healthpb.RegisterHealthServer(srv, health{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := healthpb.NewHealthClient(conn)

	call := func(key, service string) error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key)
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return err
	}
	require.NoError(t, call("check-1", "payments"))
	require.NoError(t, call("check-1", "payments"))
	require.Equal(t, codes.Unavailable, status.Code(call("check-2", "broken")))

	// The server may end a span after its client has the answer: wait for
	// all three, and take them in the order the calls started.
	var ended []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		ended = slices.DeleteFunc(tel.spans.Ended(), func(s sdktrace.ReadOnlySpan) bool {
			return s.Name() != "grpc.health.v1.Health/Check"
		})
		return len(ended) == 3
	}, 5*time.Second, time.Millisecond, "one server span per call")
	slices.SortFunc(ended, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	var spans []map[attribute.Key]attribute.Value
	for _, s := range ended {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		spans = append(spans, m)
	}
	first, repeat, broken := spans[0], spans[1], spans[2]
	assert.Equal(t, "processed", first[idemotel.AttrOutcome].AsString())
	assert.False(t, first[idemotel.AttrReplayed].AsBool())
	assert.Equal(t, int64(1), first[idemotel.AttrAttempt].AsInt64())
	assert.Equal(t, "duplicate", repeat[idemotel.AttrOutcome].AsString())
	assert.True(t, repeat[idemotel.AttrReplayed].AsBool())
	assert.Equal(t, first[idemotel.AttrKeyHash], repeat[idemotel.AttrKeyHash], "the same stored key")
	assert.Len(t, first[idemotel.AttrKeyHash].AsString(), 64)
	assert.Equal(t, "handler_failed", broken[idemotel.AttrOutcome].AsString())
	assert.Equal(t, method, broken[idemotel.AttrScope].AsString())
	assert.NotEqual(t, first[idemotel.AttrKeyHash], broken[idemotel.AttrKeyHash])

	outcomes, _ := tel.collect(t, "")
	assert.Equal(t, map[string]int64{method + "/processed": 1, method + "/duplicate": 1, method + "/handler_failed": 1}, outcomes)
}
