package grpcidem_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
)

// TestDeprecatedNames: code written against the former names still
// compiles and behaves as with the new ones: an Interceptor is a
// Middleware, its Unary is UnaryServerInterceptor, and a Client's Unary is
// UnaryClientInterceptor. The client gives two logical calls one key (its
// NewKey returns it); the server runs the first and replays it to the
// second.
func TestDeprecatedNames(t *testing.T) {
	store, prefix := storeKinds[0].New(t)
	var idem *grpcidem.Interceptor = newInterceptor(t, store, prefix, nil)
	l := newLedger()
	addr := serve(t, l, idem.Unary)
	client, err := grpcidem.NewClient(grpcidem.ClientConfig{NewKey: func() string { return "old-names" }})
	require.NoError(t, err)
	c := dial(t, addr, grpc.WithChainUnaryInterceptor(client.Unary))

	first := charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 5})
	require.NoError(t, first.err)
	assert.Equal(t, "old-names", first.reply.Key, "the client interceptor gave the call its key")
	assert.False(t, first.replayed())
	again := charge(t, c, "t", "", &testpb.ChargeRequest{Amount: 5})
	require.NoError(t, again.err)
	assert.True(t, again.replayed(), "the server interceptor replayed the first answer")
	assert.Equal(t, first.reply.Key, again.reply.Key)
	assert.EqualValues(t, 1, l.runs.Load())
}
