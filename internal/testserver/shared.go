package testserver

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"
)

// RedisAddr returns the shared Redis server's address (REDIS_ADDR, default
// 127.0.0.1:6379), failing the test when it does not answer.
func RedisAddr(t testing.TB) string {
	t.Helper()
	addr := Env("REDIS_ADDR", "127.0.0.1:6379")
	requireService(t, "Redis", "REDIS_ADDR", addr)
	return addr
}

// RedisClient returns a client of the shared Redis server, closed when the
// test ends. Tests must isolate their keys by prefix: the server is shared,
// and nothing here flushes it.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: RedisAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", c.Options().Addr, err)
	}
	return c
}

// NATSURL returns the shared NATS server's URL (NATS_URL, default
// nats://127.0.0.1:4222), failing the test when it does not answer. The server
// must run with JetStream enabled. Tests must isolate themselves with unique
// subjects, streams and durable names: the server is shared.
// DeleteNATSStreams removes what a test created.
func NATSURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "NATS", "NATS_URL", "nats://127.0.0.1:4222", "4222")
}

// RabbitMQURL returns the shared RabbitMQ server's AMQP URL (AMQP_URL,
// default amqp://guest:guest@127.0.0.1:5672/), failing the test when it does
// not answer. Tests must isolate themselves with unique exchange and queue
// names: the server is shared. DeleteAMQP removes what a test declared.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "RabbitMQ", "AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "5672")
}

// DeleteNATSStreams deletes the JetStream stream that captures each topic,
// and with it the stream's durable consumers (brokeradmin.DeleteNATSStreams).
// Failures are logged, not fatal: it is cleanup.
func DeleteNATSStreams(t testing.TB, url string, topics ...string) {
	if err := brokeradmin.DeleteNATSStreams(url, topics...); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

// WithJetStream runs f on a JetStream context of the NATS server at url,
// on a connection of its own, for cleanup: when connecting fails, it logs
// why and does not run f.
func WithJetStream(t testing.TB, url string, f func(js nats.JetStreamContext)) {
	js, closeConn, err := brokeradmin.JetStream(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer closeConn()
	f(js)
}

// DeleteAMQP deletes the exchange of each topic and the queue of each topic
// and group, as the backends package names them
// (brokeradmin.DeleteAMQP). Failures are logged, not fatal: it is cleanup.
func DeleteAMQP(t testing.TB, url string, topics, groups []string) {
	if err := brokeradmin.DeleteAMQP(url, topics, groups); err != nil {
		t.Logf("cleanup: %v", err)
	}
}
