package idempotency_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// The middleware wraps any handler: three deliveries of one requestId charge
// once.
func Example() {
	idem, err := newMiddleware(testConfig{Store: memstore.New(memstore.Config{})}, nil)
	if err != nil {
		panic(err)
	}
	charge := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("charging", msg.Metadata.Get("requestId"), string(msg.Payload))
		return nil, nil
	})
	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), []byte("42 EUR"))
		msg.Metadata.Set("requestId", "order-1")
		if _, err := charge(msg); err != nil {
			fmt.Println("nack:", err)
		}
	}
	// Output: charging order-1 42 EUR
}

// With a router, the middleware is added once for every handler. A handler
// that fails is retried on redelivery; once it succeeded, copies are acked
// without running it.
func Example_router() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	idem, err := newMiddleware(testConfig{
		Store:     memstore.New(memstore.Config{}),
		NackDelay: -1, // gochannel redelivers at once; no need to wait in an example
	}, nil)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(idem.Middleware)

	failed := false
	router.AddConsumerHandler("ship", "orders", pubSub, func(msg *message.Message) error {
		if !failed {
			failed = true
			fmt.Println("ship", msg.Metadata.Get("requestId"), "failed, will be redelivered")
			return fmt.Errorf("warehouse busy")
		}
		fmt.Println("shipped", msg.Metadata.Get("requestId"))
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("requestId", "order-7")
		_ = pubSub.Publish("orders", msg) // returns once the copy is acked
	}
	_ = router.Close()
	// Output:
	// ship order-7 failed, will be redelivered
	// shipped order-7
}

// Once.Do works without Watermill: any Go code gets one run per key across
// every process sharing the store, and every later caller gets the first
// run's result back.
func ExampleOnce_Do() {
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(memstore.Config{})})
	if err != nil {
		panic(err)
	}
	sendInvoice := func(ctx context.Context) ([]byte, error) {
		fmt.Println("sending the invoice")
		return []byte("receipt-17"), nil
	}
	for range 3 {
		res, err := once.Do(context.Background(), "invoice:2026-11:customer-17", sendInvoice)
		if err != nil {
			fmt.Println("try later:", err)
			continue
		}
		fmt.Printf("%s %s\n", res.Value, res.Outcome)
	}
	// Output:
	// sending the invoice
	// receipt-17 processed
	// receipt-17 duplicate
	// receipt-17 duplicate
}
