package demo

import (
	"context"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
)

// Serve listens on ADDR, or on defaultAddr when ADDR is unset, logs that
// what (the example's server) listens there, and runs serve on the listener until the process is
// told to stop (see ServeUntilSignal).
func Serve(logger watermill.LoggerAdapter, what, defaultAddr string, serve func(net.Listener) error, shutdown func() error) error {
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger.Info(what+" listening", watermill.LogFields{"addr": addr})
	return ServeUntilSignal(func() error { return serve(ln) }, shutdown)
}

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
