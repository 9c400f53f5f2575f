package testserver

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// NATSURL returns the shared NATS server's URL (NATS_URL, default
// nats://127.0.0.1:4222), failing the test when it does not answer. The server
// must run with JetStream enabled. Tests must isolate themselves with unique
// subjects, streams and durable names: the server is shared.
// DeleteNATSStreams removes what a test created.
func NATSURL(t testing.TB) string {
	t.Helper()
	raw := Env("NATS_URL", "nats://127.0.0.1:4222")
	requireService(t, "NATS", "NATS_URL", hostPort(t, "NATS_URL", raw, "4222"))
	return raw
}

// DeleteNATSStreams deletes the JetStream stream that captures each topic,
// and with it the stream's durable consumers. Failures are logged, not
// fatal: it is cleanup.
func DeleteNATSStreams(t testing.TB, url string, topics ...string) {
	WithJetStream(t, url, func(js nats.JetStreamContext) {
		for _, topic := range topics {
			if stream, err := js.StreamNameBySubject(topic); err == nil {
				_ = js.DeleteStream(stream)
			}
		}
	})
}

// WithJetStream runs f on a JetStream context of the NATS server at url,
// on a connection of its own, for cleanup: when connecting fails, it logs
// why and does not run f.
func WithJetStream(t testing.TB, url string, f func(js nats.JetStreamContext)) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	f(js)
}
