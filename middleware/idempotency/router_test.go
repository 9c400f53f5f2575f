package idempotency_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// startRouter runs a router configured by setup until the test ends.
func startRouter(t *testing.T, setup func(r *message.Router)) {
	t.Helper()
	startRouterLogging(t, watermill.NopLogger{}, setup)
}

// startRouterLogging is startRouter with the router's logger; it returns
// a function that stops the router before the test ends.
func startRouterLogging(t *testing.T, logger watermill.LoggerAdapter, setup func(r *message.Router)) (stop func()) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)
	setup(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	select {
	case <-r.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); _ = r.Close(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// acks is an outer middleware that counts the deliveries the router acks
// (handler chain returned no error) and nacks.
type acks struct{ acked, nacked atomic.Int32 }

func (a *acks) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			a.nacked.Add(1)
		} else {
			a.acked.Add(1)
		}
		return out, err
	}
}

func TestPermanentErrorsGoToPoisonQueue(t *testing.T) {
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	poisoned, err := pubSub.Subscribe(context.Background(), "poison")
	require.NoError(t, err)

	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{}), MaxAttempts: 1})
	poison, err := wmmiddleware.PoisonQueueWithFilter(pubSub, "poison", idempotency.IsPermanent)
	require.NoError(t, err)
	h := &counter{}
	h.failFor.Store(1 << 20) // always fails
	startRouter(t, func(r *message.Router) {
		r.AddMiddleware(poison, idem.Middleware)
		r.AddConsumerHandler("h", "in", pubSub, func(msg *message.Message) error {
			_, err := h.handle(msg)
			return err
		})
	})

	require.NoError(t, pubSub.Publish("in", message.NewMessage("", []byte("no key at all"))))
	require.NoError(t, pubSub.Publish("in", newMsg("poison-pill", "p")))

	reasons := map[string]bool{}
	for range 2 {
		select {
		case m := <-poisoned:
			reasons[m.Metadata.Get(wmmiddleware.ReasonForPoisonedKey)] = true
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("poison queue got %d of 2 messages", len(reasons))
		}
	}
	assert.Len(t, reasons, 2)
	assert.EqualValues(t, 1, h.runs.Load(), "the failing handler ran MaxAttempts times; the keyless one never")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeMissingKey))
	assert.Equal(t, 1, obs.get(idempotency.OutcomeTooManyAttempts))
}

func TestScopeKeepsHandlersOfOneTopicApart(t *testing.T) {
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	idem, obs := newIdem(t, testConfig{Store: memstore.New(memstore.Config{})})
	var mu sync.Mutex
	runs := map[string]int{}
	startRouter(t, func(r *message.Router) {
		r.AddMiddleware(idem.Middleware)
		for _, name := range []string{"billing", "shipping"} {
			r.AddConsumerHandler(name, "orders", pubSub, func(msg *message.Message) error {
				mu.Lock()
				runs[name]++
				mu.Unlock()
				return nil
			})
		}
	})
	for range 3 {
		require.NoError(t, pubSub.Publish("orders", newMsg("order-1", "p")))
	}
	require.Eventually(t, func() bool { return obs.get(idempotency.OutcomeDuplicate) == 4 }, 10*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"billing": 1, "shipping": 1}, runs, "each handler runs once for the key")
}

// The recommended stack: PoisonQueue and Recoverer outside the middleware,
// Timeout inside. A hung handler is cut by Timeout (otherwise it would renew
// its lease for ever), its key is left FAILED, the message is nacked, and
// the redelivery runs the handler again.
func TestRecommendedStackTimeoutCutsAHungHandler(t *testing.T) {
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	store := memstore.New(memstore.Config{})
	idem, obs := newIdem(t, testConfig{Store: store, MaxAttempts: 3})
	poison, err := wmmiddleware.PoisonQueueWithFilter(pubSub, "poison", idempotency.IsPermanent)
	require.NoError(t, err)
	var runs atomic.Int32
	var secondAttempt atomic.Value // the key's attempts as the second run starts
	startRouter(t, func(r *message.Router) {
		r.AddMiddleware(wmmiddleware.CorrelationID, poison, wmmiddleware.Recoverer, idem.Middleware,
			wmmiddleware.Timeout(100*time.Millisecond))
		r.AddConsumerHandler("hangs-once", "in", pubSub, func(msg *message.Message) error {
			if runs.Add(1) == 1 {
				<-msg.Context().Done() // hung until Timeout cuts it
				return msg.Context().Err()
			}
			key, err := idem.StoreKey(msg)
			if err != nil {
				return err
			}
			rec, err := store.Get(context.Background(), key)
			if err != nil {
				return err
			}
			secondAttempt.Store(rec.Attempts)
			return nil
		})
	})
	require.NoError(t, pubSub.Publish("in", newMsg("hung", "p")))
	require.Eventually(t, func() bool { return obs.get(idempotency.OutcomeProcessed) == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 2, runs.Load(), "the redelivery ran the handler again")
	assert.Equal(t, 1, obs.get(idempotency.OutcomeHandlerFailed), "the timed-out run left the key FAILED")
	assert.Equal(t, 2, secondAttempt.Load(), "the second run is the key's second attempt")
}
