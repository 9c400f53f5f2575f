//go:build !race

package amqpbackend_test

import (
	neturl "net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// A RabbitMQ connection that stops carrying anything (a stalled network
// path: open, silent) fails a Publish with an error instead of leaving it
// waiting for a confirm that never comes. Built only without the race
// detector: watermill-amqp's reconnect, which the stall sets off, writes
// the connection field that its Close reads without a lock (as in
// TestRestart_AMQP of package backends); .ci/run runs it, required.
func TestAMQP_StalledConnectionFailsThePublish(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	u, err := neturl.Parse(url)
	require.NoError(t, err)
	proxy := testserver.StartFaultProxy(t, u.Host)
	u.Host = proxy.Addr
	topic := backendtest.UniqueTopic("stalled")
	group := "stalled-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })
	b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(u.String(), "publish_groups", group), Group: group})
	backendtest.Publish(t, b.Publisher, topic, "before")

	require.Positive(t, proxy.StallAll())
	t.Cleanup(proxy.ResumeAll)
	done := make(chan error, 1)
	go func() { done <- b.Publisher.Publish(topic, backendtest.NewMessage("stalled")) }()
	select {
	case err := <-done:
		require.Error(t, err, "a publish that RabbitMQ never confirmed")
	case <-time.After(90 * time.Second):
		t.Fatal("Publish still waits for a confirm over a dead connection after 90 s")
	}
}
