// Command natsbackend links package backends with natsbackend, its one broker beside gochannel.
// TestLinkedModules lists the modules it links.
package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/natsbackend"
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
