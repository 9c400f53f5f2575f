package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/all" // every broker: BROKER_URL picks one
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

const copies = 3

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "broker-switch:", err)
		os.Exit(1)
	}
}

func run(w io.Writer) error {
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	orders := 50
	if v := os.Getenv("ORDERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("ORDERS=%q: want a positive number", v)
		}
		orders = n
	}
	cfg, err := brokerFromEnv("broker-switch")
	if err != nil {
		return err
	}
	broker, err := cfg.Broker()
	if err != nil {
		return err
	}
	b, err := backends.New(cfg, logger)
	if err != nil {
		return err
	}
	defer b.Close()

	store, closeStore, err := openStore(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer closeStore()

	stats := &outcomes{}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: stats, Logger: logger})
	if err != nil {
		return err
	}
	// The lease must stay below the broker's redelivery timer (NATS
	// AckWait, Redis Streams MaxIdleTime), both set from the environment.
	if err := cfg.CheckLease(once); err != nil {
		return err
	}
	idem, err := idempotency.New(once, &idempotency.Config{NackDelay: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	router, err := newRouter(logger, idem.Middleware)
	if err != nil {
		return err
	}

	var mu sync.Mutex
	effects := map[string]int{}
	runID := watermill.NewShortUUID()
	topic := "orders-" + runID // a topic and order numbers of this run's own
	router.AddConsumerHandler("charge", topic, b.Subscriber, func(msg *message.Message) error {
		mu.Lock()
		effects[msg.Metadata.Get("requestId")]++
		mu.Unlock()
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	<-router.Running()

	for i := range orders {
		for range copies {
			// A producer's retries: a new UUID each time, the same requestId.
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":42}`))
			msg.Metadata.Set("requestId", fmt.Sprintf("order-%s-%d", runID, i))
			if err := b.Publisher.Publish(topic, msg); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
		}
	}

	deliveries := func() int { return stats.Count(idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate) }
	deadline := time.Now().Add(2 * time.Minute)
	for deliveries() < orders*copies {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: only %d of %d deliveries acked in time", broker, deliveries(), orders*copies)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-routerDone; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	exactlyOnce := len(effects) == orders
	for _, n := range effects {
		exactlyOnce = exactlyOnce && n == 1
	}
	fmt.Fprintf(w, "broker=%s deliveries=%d processed=%d duplicates=%d effects=%d exactly-once=%t\n",
		broker, deliveries(), stats.Count(idempotency.OutcomeProcessed), stats.Count(idempotency.OutcomeDuplicate), len(effects), exactlyOnce)
	if !exactlyOnce {
		return errors.New("an order was charged more or less than once")
	}
	return nil
}
