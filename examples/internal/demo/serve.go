package demo

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// ServeUntilSignal runs serve until it fails, or until the process gets
// SIGINT or SIGTERM; then it calls shutdown, which must make serve return,
// and returns shutdown's error. A server's graceful shutdown waits for the
// calls in flight, so that their outcome gets recorded.
func ServeUntilSignal(serve, shutdown func() error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	return shutdown()
}
