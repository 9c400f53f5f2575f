package e2e

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// fleet is the scenario's consumers, each a member of its group with its
// own connections, store client and router.
type fleet struct {
	shared    *backends.Backend // gochannel: the one instance every member shares
	consumers []*consumer
	// fanout is how many consumers receive each published message: 1 with
	// consumer groups, every consumer on gochannel, which has none.
	fanout atomic.Int64
	// lease is the consumers' LeaseTTL; by default the package's lease.
	lease time.Duration
	// configure, when set, adjusts the backends configuration of every
	// member built after it is set.
	configure func(cfg *backends.Config)
	// maxAttempts is the middleware's MaxAttempts; poisonTopic, when set,
	// puts Watermill's PoisonQueueWithFilter (IsPermanent), publishing
	// there, between the tracker and the middleware.
	maxAttempts int
	poisonTopic string
}

// consumer is one member of the group: its own connections and router.
type consumer struct {
	r      *message.Router
	b      *backends.Backend
	cancel context.CancelFunc
	done   chan struct{}
}

// backend builds one member's Publisher and Subscriber; on gochannel every
// member gets the shared instance.
func (e *env) backend(member string) *backends.Backend {
	if e.shared != nil {
		return e.shared
	}
	cfg := e.b.config(e.url, e.group, e.id+"-"+member)
	if e.configure != nil {
		e.configure(&cfg)
	}
	b, err := backends.New(cfg, logger())
	require.NoError(e.t, err)
	return b
}

// newMiddleware is the middleware of every consumer, in this process or in
// a child: the scenario's timers, scaled down from production's.
func newMiddleware(store idempotency.Store, prefix string, leaseTTL time.Duration, obs idempotency.Observer, maxAttempts int) (*idempotency.Middleware, error) {
	once, err := idempotency.NewOnce(idempotency.OnceConfig{
		Store:        store,
		Logger:       logger(),
		LeaseTTL:     leaseTTL,
		StoreTimeout: time.Second,
		CompletedTTL: time.Hour,
		FailedTTL:    time.Hour,
		Observer:     obs,
		MaxAttempts:  maxAttempts,
	})
	if err != nil {
		return nil, err
	}
	return idempotency.New(once, &idempotency.Config{KeyPrefix: prefix, NackDelay: nackDelay})
}

// newIdem is one consumer's middleware.
func (e *env) newIdem() *idempotency.Middleware {
	idem, err := newMiddleware(e.newStore(), e.prefix, e.lease, e.obs, e.maxAttempts)
	require.NoError(e.t, err)
	return idem
}

// startConsumers starts n members of the group, each with its own backend,
// store client and router; wire adds the handlers, after the tracker and
// the idempotency middleware.
func (e *env) startConsumers(n int, wire func(r *message.Router, b *backends.Backend)) {
	e.t.Helper()
	for i := range n {
		b := e.backend("c" + strconv.Itoa(i))
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger())
		require.NoError(e.t, err)
		r.AddMiddleware(e.tr.middleware)
		if e.poisonTopic != "" {
			poison, err := wmmiddleware.PoisonQueueWithFilter(b.Publisher, e.poisonTopic, idempotency.IsPermanent)
			require.NoError(e.t, err)
			r.AddMiddleware(poison)
		}
		r.AddMiddleware(e.newIdem().Middleware)
		wire(r, b)
		ctx, cancel := context.WithCancel(context.Background())
		c := &consumer{r: r, b: b, cancel: cancel, done: make(chan struct{})}
		go func() { defer close(c.done); _ = r.Run(ctx) }()
		select {
		case <-r.Running():
		case <-time.After(30 * time.Second):
			e.t.Fatalf("consumer %d of %s did not start", i, e.id)
		}
		e.consumers = append(e.consumers, c)
		if e.shared != nil || len(e.consumers) == 1 {
			e.fanout.Store(int64(len(e.consumers)))
		}
	}
}

// handle starts n members whose one handler consumes the scenario's topic.
func (e *env) handle(n int, h message.NoPublishHandlerFunc) {
	e.startConsumers(n, func(r *message.Router, b *backends.Backend) {
		r.AddConsumerHandler(handlerName, e.topic, b.Subscriber, h)
	})
}

func (e *env) stopConsumers() {
	for _, c := range e.consumers {
		c.cancel()
		_ = c.r.Close()
		<-c.done
		if c.b != e.shared {
			_ = c.b.Close()
		}
	}
	e.consumers = nil
}
