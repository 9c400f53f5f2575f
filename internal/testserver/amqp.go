package testserver

import (
	"net"
	"net/url"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// RabbitMQURL returns the shared RabbitMQ server's AMQP URL (AMQP_URL,
// default amqp://guest:guest@127.0.0.1:5672/), failing the test when it does
// not answer. Tests must isolate themselves with unique exchange and queue
// names: the server is shared. DeleteAMQP removes what a test declared.
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

// DeleteAMQP deletes the exchange of each topic and the queue topic_group of
// each topic and group, as the backends package names them. Deleting what
// does not exist is not an error in RabbitMQ; a failed operation closes its
// channel, so a new one is opened after it. Failures are logged, not fatal:
// it is cleanup.
func DeleteAMQP(t testing.TB, url string, topics, groups []string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	retry := func(err error) {
		if err != nil {
			if ch, err = conn.Channel(); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
	}
	seen := map[string]bool{}
	for _, topic := range topics {
		for _, g := range groups {
			if q := topic + "_" + g; !seen[q] && ch != nil {
				seen[q] = true
				_, err := ch.QueueDelete(q, false, false, false)
				retry(err)
			}
		}
		if ch != nil {
			retry(ch.ExchangeDelete(topic, false, false))
		}
	}
}
