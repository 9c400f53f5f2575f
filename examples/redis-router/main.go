package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/backends"
	idempotency "github.com/idempotency/watermill-idempotency/middleware"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

func main() {
	logger := watermill.NewStdLogger(false, false)
	store := must(redisstore.New(redis.NewClient(&redis.Options{Addr: "localhost:6379"})))
	idem := must(idempotency.New(idempotency.Config{Store: store}, logger))

	broker := must(backends.New(must(backends.FromEnv()), logger)) // BROKER_URL, BROKER_GROUP
	router := must(message.NewRouter(message.RouterConfig{}, logger))
	router.AddMiddleware(idem.Middleware) // every handler: once per requestId
	router.AddNoPublisherHandler("charge", "orders", broker.Subscriber, func(msg *message.Message) error {
		return charge(msg.Metadata.Get("requestId"), msg.Payload) // runs once per key
	})
	if err := router.Run(context.Background()); err != nil {
		panic(err)
	}
}

func charge(orderID string, payload []byte) error { return nil }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
