package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

const (
	orders       = 200
	copies       = 3
	failEveryNth = 5 // the first attempt of every 5th order fails
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(w io.Writer) error {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	defer pubSub.Close()

	store := memstore.New(memstore.Config{})
	stats := &outcomes{} // counts what the middleware did with each delivery
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: stats, Logger: logger})
	if err != nil {
		return err
	}
	idem, err := idempotency.New(once, &idempotency.Config{
		NackDelay: 10 * time.Millisecond, // gochannel redelivers a nack at once
	})
	if err != nil {
		return err
	}

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(idem.Middleware)

	var mu sync.Mutex
	charged := map[string]int{} // the side effect: what a payment provider would see
	failedOnce := map[string]bool{}
	router.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		order := msg.Metadata.Get("requestId")
		mu.Lock()
		defer mu.Unlock()
		if hash(order)%failEveryNth == 0 && !failedOnce[order] {
			failedOnce[order] = true
			return fmt.Errorf("payment provider timeout for %s", order)
		}
		charged[order]++
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	for i := range orders {
		order := fmt.Sprintf("order-%03d", i)
		first := message.NewMessage(watermill.NewUUID(), []byte(`{"amount":42}`))
		first.Metadata.Set("requestId", order)
		redelivery := first.Copy() // the same message delivered twice
		retry := message.NewMessage(watermill.NewUUID(), first.Payload)
		retry.Metadata.Set("requestId", order) // a producer's retry: new UUID, same requestId
		for _, m := range []*message.Message{first, redelivery, retry}[:copies] {
			if err := pubSub.Publish("orders", m); err != nil {
				return err
			}
		}
	}

	acked := func() int {
		return stats.Count(idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate)
	}
	deadline := time.Now().Add(30 * time.Second)
	for acked() < orders*copies {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d deliveries acked in time", acked(), orders*copies)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = router.Close()

	fmt.Fprintf(w, "published %d deliveries: %d orders × %d copies\n", orders*copies, orders, copies)
	counts := stats.All()
	names := make([]string, 0, len(counts))
	for o := range counts {
		names = append(names, string(o))
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-16s %5d\n", name, counts[idempotency.Outcome(name)])
	}

	mu.Lock()
	defer mu.Unlock()
	exactlyOnce := 0
	for i := range orders {
		if charged[fmt.Sprintf("order-%03d", i)] == 1 {
			exactlyOnce++
		}
	}
	if exactlyOnce != orders || len(charged) != orders {
		return fmt.Errorf("FAILED: %d of %d orders charged exactly once (%d charged at all)", exactlyOnce, orders, len(charged))
	}
	fmt.Fprintf(w, "OK: %d of %d unique orders charged exactly once\n", exactlyOnce, orders)
	return nil
}

func hash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}
