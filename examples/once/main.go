package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

const (
	customers = 50
	workers   = 4
	month     = "2026-11"
)

func main() {
	if err := run(os.Stdout, os.Getenv("REDIS_ADDR")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run sends every customer's invoice once, with workers racing each other,
// on Redis at redisAddr or, when it is empty, on the in-memory store.
func run(out io.Writer, redisAddr string) error {
	store, err := openStore(redisAddr)
	if err != nil {
		return err
	}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	if err != nil {
		return err
	}
	// The key names the effect, not the run: every replica, every retry and
	// every rerun of this month's job computes the same one. A prefix unique
	// to this run keeps reruns of the example apart on a shared Redis.
	prefix := "example-once:" + watermill.NewShortUUID() + ":invoice:" + month + ":"

	var (
		mu       sync.Mutex
		sent     = map[int]int{} // the ledger: invoices sent per customer
		replayed int
		failed   = map[int]bool{} // customers whose first send failed
	)
	send := func(ctx context.Context, customer int) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if customer%7 == 0 && !failed[customer] {
			failed[customer] = true
			return nil, errors.New("mail server busy")
		}
		sent[customer]++
		return fmt.Appendf(nil, "receipt-%d", customer), nil
	}

	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			todo := make([]int, customers)
			for i := range todo {
				todo[i] = i
			}
			for len(todo) > 0 {
				c := todo[0]
				todo = todo[1:]
				res, err := once.Do(context.Background(), fmt.Sprint(prefix, c), func(ctx context.Context) ([]byte, error) {
					return send(ctx, c)
				})
				switch {
				case errors.Is(err, idempotency.ErrInProgress):
					todo = append(todo, c) // another worker is sending it: look again later
					time.Sleep(time.Millisecond)
				case err != nil:
					todo = append(todo, c) // it failed: try again
				case res.Outcome == idempotency.OutcomeDuplicate:
					mu.Lock()
					replayed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()

	fmt.Fprintf(out, "%d workers, %d customers: %d first attempts failed and ran again, %d results replayed\n",
		workers, customers, len(failed), replayed)
	for c := range customers {
		if sent[c] != 1 {
			return fmt.Errorf("customer %d got %d invoices", c, sent[c])
		}
	}
	fmt.Fprintf(out, "OK: %d of %d invoices sent exactly once\n", len(sent), customers)
	return nil
}

func openStore(redisAddr string) (idempotency.Store, error) {
	if redisAddr == "" {
		return memstore.New(memstore.Config{}), nil
	}
	store, _, err := redisstore.NewFromURL("redis://"+redisAddr, redisstore.Options{})
	return store, err
}
