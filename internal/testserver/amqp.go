package testserver

import (
	"net"
	"net/url"
	"testing"
)

// RabbitMQURL returns the shared RabbitMQ server's AMQP URL (AMQP_URL,
// default amqp://guest:guest@127.0.0.1:5672/), failing the test when it does
// not answer. Tests must isolate themselves with unique exchange and queue
// names: the server is shared, and nothing here deletes anything on it.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	raw := Env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	requireService(t, "RabbitMQ", "AMQP_URL", hostPort(t, "AMQP_URL", raw, "5672"))
	return raw
}

// hostPort returns the host:port that rawURL points at, with defPort when the
// URL has none.
func hostPort(t testing.TB, envVar, rawURL, defPort string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		t.Fatalf("%s=%q is not a server URL: %v", envVar, rawURL, err)
	}
	port := u.Port()
	if port == "" {
		port = defPort
	}
	return net.JoinHostPort(u.Hostname(), port)
}
