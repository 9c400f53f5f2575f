package testserver

import "testing"

// NATSURL returns the shared NATS server's URL (NATS_URL, default
// nats://127.0.0.1:4222), failing the test when it does not answer. The server
// must run with JetStream enabled. Tests must isolate themselves with unique
// subjects, streams and durable names: the server is shared, and nothing here
// deletes anything on it.
func NATSURL(t testing.TB) string {
	t.Helper()
	raw := Env("NATS_URL", "nats://127.0.0.1:4222")
	requireService(t, "NATS", "NATS_URL", hostPort(t, "NATS_URL", raw, "4222"))
	return raw
}
