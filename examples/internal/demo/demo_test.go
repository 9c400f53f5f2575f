package demo_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/examples/internal/demo"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// TestOpenStore: no URL is the in-memory store, a redis:// URL the Redis
// store on that server, anything else an error.
func TestOpenStore(t *testing.T) {
	mem, closeMem, err := demo.OpenStore("")
	require.NoError(t, err)
	t.Cleanup(closeMem)
	assert.IsType(t, &memstore.Store{}, mem)

	rs, closeRedis, err := demo.OpenStore("redis://" + testserver.RedisAddr(t) + "/0")
	require.NoError(t, err)
	t.Cleanup(closeRedis)
	require.IsType(t, &redisstore.Store{}, rs)
	key := "demo-test:" + t.Name() + time.Now().Format(time.RFC3339Nano)
	t.Cleanup(func() { _ = testserver.RedisClient(t).Del(context.Background(), key).Err() })
	res, err := rs.Claim(t.Context(), key, idempotency.ClaimRequest{Token: "token", Lease: time.Second, TTL: time.Minute})
	require.NoError(t, err)
	assert.True(t, res.Acquired, "the store works on that server")

	_, _, err = demo.OpenStore("http://not-redis")
	assert.Error(t, err, "REDIS_URL must be a redis:// URL")
}

func TestOutcomes(t *testing.T) {
	var o demo.Outcomes
	assert.Zero(t, o.Count(idempotency.OutcomeProcessed), "the zero value counts nothing")
	o.Outcome("h", idempotency.OutcomeProcessed)
	o.Outcome("h", idempotency.OutcomeDuplicate)
	o.Outcome("other", idempotency.OutcomeDuplicate)
	assert.Equal(t, 2, o.Count(idempotency.OutcomeDuplicate))
	assert.Equal(t, 3, o.Count(idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate))
	all := o.All()
	assert.Equal(t, map[idempotency.Outcome]int{idempotency.OutcomeProcessed: 1, idempotency.OutcomeDuplicate: 2}, all)
	all[idempotency.OutcomeProcessed] = 99
	assert.Equal(t, 1, o.Count(idempotency.OutcomeProcessed), "All returns a copy")
}

func TestBrokerFromEnv(t *testing.T) {
	t.Setenv("BROKER_URL", "")
	t.Setenv("BROKER_GROUP", "")
	cfg, err := demo.BrokerFromEnv("demo")
	require.NoError(t, err)
	assert.Equal(t, "gochannel://", cfg.URL)
	assert.Equal(t, "demo", cfg.Group)

	t.Setenv("BROKER_URL", "nats://127.0.0.1:4222")
	t.Setenv("BROKER_GROUP", "billing")
	cfg, err = demo.BrokerFromEnv("demo")
	require.NoError(t, err)
	assert.Equal(t, "nats://127.0.0.1:4222", cfg.URL, "the environment wins")
	assert.Equal(t, "billing", cfg.Group)

	t.Setenv("BROKER_NACK_RESEND_SLEEP", "soon")
	_, err = demo.BrokerFromEnv("demo")
	assert.Error(t, err)
}

// TestServeUntilSignal: a failing server's error is returned; SIGTERM
// shuts a running one down and returns the shutdown's result.
func TestServeUntilSignal(t *testing.T) {
	failed := errors.New("listen failed")
	err := demo.ServeUntilSignal(func() error { return failed }, func() error {
		t.Error("no shutdown of a server that failed")
		return nil
	})
	assert.Equal(t, failed, err)

	serving, stopped := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- demo.ServeUntilSignal(func() error {
			close(serving) // the signal handler is installed before serve runs
			<-stopped
			return errors.New("server closed")
		}, func() error {
			close(stopped)
			return errors.New("shut down")
		})
	}()
	<-serving
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM))
	select {
	case err := <-done:
		assert.EqualError(t, err, "shut down")
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not stop the server")
	}
}

// TestServe: the server gets a listener on ADDR, and a failure to listen
// is returned.
func TestServe(t *testing.T) {
	t.Setenv("ADDR", "127.0.0.1:0")
	served := errors.New("served")
	err := demo.Serve(watermill.NopLogger{}, "test", "unused:1", func(ln net.Listener) error {
		assert.Equal(t, "127.0.0.1", ln.Addr().(*net.TCPAddr).IP.String(), "listens on ADDR")
		_ = ln.Close()
		return served
	}, func() error {
		t.Error("no shutdown of a server that returned")
		return nil
	})
	assert.Equal(t, served, err)

	t.Setenv("ADDR", "")
	err = demo.Serve(watermill.NopLogger{}, "test", "not an address", func(net.Listener) error {
		t.Error("no serving without a listener")
		return nil
	}, func() error { return nil })
	assert.Error(t, err, "without ADDR, the default address is used")
}

// TestNewRouter: the middlewares given run around every handler.
func TestNewRouter(t *testing.T) {
	wrapped := make(chan string, 1)
	mark := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			wrapped <- msg.UUID
			return h(msg)
		}
	}
	router, err := demo.NewRouter(watermill.NopLogger{}, mark)
	require.NoError(t, err)
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router.AddConsumerHandler("h", "topic", pubSub, func(*message.Message) error { return nil })
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	require.NoError(t, pubSub.Publish("topic", message.NewMessage("m1", nil)))
	select {
	case uuid := <-wrapped:
		assert.Equal(t, "m1", uuid)
	case <-time.After(10 * time.Second):
		t.Fatal("the middleware did not run")
	}
	require.NoError(t, router.Close())
}
