package main

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/all" // every broker; or import only yours (README: Brokers)
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

func main() {
	logger := watermill.NewStdLogger(false, false)
	store, _, err := redisstore.NewFromURL("redis://localhost:6379/0", redisstore.Options{})
	if err != nil {
		panic(err)
	}
	once := must(idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger, MaxAttempts: 5}))
	idem := must(idempotency.New(once, nil))

	broker := must(backends.New(must(backends.FromEnv()), logger)) // BROKER_URL, BROKER_GROUP
	poison := must(middleware.PoisonQueueWithFilter(broker.Publisher, "orders_poison", idempotency.IsPermanent))
	router := must(message.NewRouter(message.RouterConfig{}, idempotency.RouterLogger(logger))) // in-progress copies at Debug
	router.AddMiddleware(
		middleware.CorrelationID,
		poison,                          // outside: takes ErrTooManyAttempts and ErrMissingKey off the topic
		middleware.Recoverer,            // a panic is an error; the key is left FAILED
		idem.Middleware,                 // once per requestId, per handler
		middleware.Timeout(time.Minute), // inside: a handler stuck past it is cancelled, left FAILED, retried
	)
	router.AddConsumerHandler("charge", "orders", broker.Subscriber, func(msg *message.Message) error {
		return charge(msg.Context(), msg.Metadata.Get("requestId"), msg.Payload) // runs once per key
	})
	if err := router.Run(context.Background()); err != nil {
		panic(err)
	}
}

func charge(ctx context.Context, orderID string, payload []byte) error { return nil }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
