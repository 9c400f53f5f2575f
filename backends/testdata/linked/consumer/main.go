// Command consumer is a consumer of the broker BROKER_URL names, among the
// brokers its build tags link: package backends alone (gochannel) without
// a tag; redisbackend, natsbackend, kafkabackend or amqpbackend with the
// tag of that name; every broker with the tag all. TestLinkedModules lists
// the modules it links under each tag.
package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends"
)

func main() {
	logger := watermill.NewStdLogger(false, false)
	cfg, err := backends.FromEnv()
	if err != nil {
		panic(err)
	}
	b, err := backends.New(cfg, logger)
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("print", "orders", b.Subscriber, func(msg *message.Message) error {
		logger.Info("received", watermill.LogFields{"uuid": msg.UUID})
		return nil
	})
	if err := router.Run(context.Background()); err != nil {
		panic(err)
	}
}
