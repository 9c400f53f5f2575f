package testserver_test

import (
	"net"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// TestRestartCommand: the command runs the restart in this process and
// returns only once it has returned; commands run together restart one
// after the other.
func TestRestartCommand(t *testing.T) {
	t.Parallel()
	var running, runs, overlaps atomic.Int32
	cmd := testserver.RestartCommand(t, func() {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(50 * time.Millisecond)
		runs.Add(1)
		running.Add(-1)
	})
	require.NoError(t, exec.Command(cmd[0], cmd[1:]...).Run())
	assert.EqualValues(t, 1, runs.Load(), "the command returned after the restart")

	done := make(chan error, 2)
	for range 2 {
		go func() { done <- exec.Command(cmd[0], cmd[1:]...).Run() }()
	}
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	assert.EqualValues(t, 3, runs.Load())
	assert.Zero(t, overlaps.Load(), "restarts asked for together run one after the other")
}

// TestNATSServerRestart: a private nats-server comes back on its port with
// the streams it had, and a second stop at the test's end does nothing.
func TestNATSServerRestart(t *testing.T) {
	t.Parallel()
	s := testserver.StartNATS(t)
	withJetStream := func(f func(js nats.JetStreamContext)) {
		nc, err := nats.Connect(s.URL)
		require.NoError(t, err)
		defer nc.Close()
		js, err := nc.JetStream()
		require.NoError(t, err)
		f(js)
	}
	withJetStream(func(js nats.JetStreamContext) {
		_, err := js.AddStream(&nats.StreamConfig{Name: "restart", Subjects: []string{"restart"}, Storage: nats.FileStorage})
		require.NoError(t, err)
	})
	s.RestartAfter(50 * time.Millisecond)
	withJetStream(func(js nats.JetStreamContext) {
		_, err := js.StreamInfo("restart")
		assert.NoError(t, err, "the stream survives the restart")
	})
}

// TestKafkaClusterRestart: a private Kafka cluster comes back on the same
// addresses.
func TestKafkaClusterRestart(t *testing.T) {
	t.Parallel()
	k := testserver.StartKafka(t, testserver.KafkaOptions{Brokers: 2})
	addrs := k.Addrs()
	require.Len(t, addrs, 2, "one address a broker")
	k.Restart()
	assert.Equal(t, addrs, k.Addrs())
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, time.Second)
		require.NoError(t, err, "broker %s answers after the restart", a)
		_ = c.Close()
	}
}
