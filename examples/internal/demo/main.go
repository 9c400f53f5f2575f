package demo

import (
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Main is the main function of an example server: it opens the store that
// REDIS_URL names (see OpenStore), runs run with it and a logger to
// standard error, closes the store, and, when run fails, prints the error
// after name and exits with status 1.
func Main(name string, run func(store idempotency.Store, logger watermill.LoggerAdapter) error) {
	if err := runWithStore(run); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// runWithStore is Main up to the exit: the store is closed when run returns.
func runWithStore(run func(idempotency.Store, watermill.LoggerAdapter) error) error {
	store, closeStore, err := OpenStore(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer closeStore()
	return run(store, watermill.NewStdLogger(false, false))
}
