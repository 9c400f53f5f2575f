package idemotel_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempotency/watermill-idempotency/middleware/idemotel"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// In a Watermill router, a tracing middleware added before the idempotency
// middleware starts the message's span and puts it in msg.Context(), as
// Watermill's OpenTelemetry middlewares do; the attributes land on that
// span, for the first delivery (failed), the redelivery (processed) and a
// copy (duplicate), each with its handler's name as the scope.
func TestRouterConsumerSpans(t *testing.T) {
	tel := newTelemetry(t, "")
	tracer := tel.tp.Tracer("test")
	tracing := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, span := tracer.Start(msg.Context(), "consume "+msg.Metadata.Get("copy"), trace.WithSpanKind(trace.SpanKindConsumer))
			defer span.End()
			msg.SetContext(ctx)
			return h(msg)
		}
	}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{}), Observer: tel.obs})
	require.NoError(t, err)
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: time.Millisecond})
	require.NoError(t, err)

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(tracing, idem.Middleware)
	var runs atomic.Int32
	router.AddConsumerHandler("billing", "orders", pubSub, func(*message.Message) error {
		if runs.Add(1) == 1 {
			return errors.New("first run fails")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-router.Running()

	publish := func(copyName string) {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("requestId", "order-1")
		msg.Metadata.Set("copy", copyName)
		require.NoError(t, pubSub.Publish("orders", msg))
	}
	publish("first") // fails, is nacked and redelivered (same span name), then processed
	require.Eventually(t, func() bool { return runs.Load() == 2 }, 5*time.Second, time.Millisecond)
	// The handler's second run returns before the tracing middleware ends
	// its span; the copy goes out once both spans of "first" have ended,
	// so the order below is the order of the deliveries.
	require.Eventually(t, func() bool { return len(tel.spans.Ended()) == 2 }, 5*time.Second, time.Millisecond)
	publish("copy")
	require.Eventually(t, func() bool { return len(tel.spans.Ended()) == 3 }, 5*time.Second, time.Millisecond)

	var got []string
	for _, s := range tel.spans.Ended() {
		attrs := map[string]any{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		assert.Equal(t, "billing", attrs[string(idemotel.AttrScope)], s.Name())
		assert.Equal(t, keyHash("idem:billing:order-1"), attrs[string(idemotel.AttrKeyHash)], s.Name())
		got = append(got, s.Name()+" "+attrs[string(idemotel.AttrOutcome)].(string))
		switch attrs[string(idemotel.AttrOutcome)] {
		case "handler_failed":
			assert.Equal(t, int64(1), attrs[string(idemotel.AttrAttempt)])
		case "processed":
			assert.Equal(t, int64(2), attrs[string(idemotel.AttrAttempt)])
			assert.Equal(t, false, attrs[string(idemotel.AttrReplayed)])
		case "duplicate":
			assert.Equal(t, true, attrs[string(idemotel.AttrReplayed)])
		}
	}
	assert.Equal(t, []string{"consume first handler_failed", "consume first processed", "consume copy duplicate"}, got)
}
