//go:build !race

package backends_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Watermill's own tests.TestReconnect on each broker: 10,000 messages from
// 100 publishers while the suite restarts the private broker twice, by
// running Features.RestartServiceCommand, which asks this process to
// restart it (testserver.RestartCommand). It is built only without the
// race detector: see reconnect_test.go.

func TestRestart_AMQP(t *testing.T) {
	t.Parallel()
	restartDuring(t, privateAMQP(t))
}

func watermillReconnect(t *testing.T, b privateBroker) {
	features := tests.Features{
		ConsumerGroups:        true,
		Persistent:            true,
		RestartServiceCommand: testserver.RestartCommand(t, b.restart),
		GenerateTopicFunc:     func(tctx tests.TestContext) string { return "reconnect-" + string(tctx.TestID) },
	}
	ctor := func(t *testing.T) (message.Publisher, message.Subscriber) {
		backend, err := backends.New(b.cfg, testLogger())
		require.NoError(t, err)
		return backend.Publisher, backend.Subscriber
	}
	tests.TestReconnect(t, tests.TestContext{TestID: tests.NewTestID(), Features: features}, ctor)
}

func TestReconnect_RedisStreams(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateRedis(t))
}

func TestReconnect_NATS(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateNATS(t))
}

func TestReconnect_Kafka(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateKafka(t))
}

func TestReconnect_AMQP(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateAMQP(t))
}

func TestRestart_Kafka(t *testing.T) {
	t.Parallel()
	restartDuring(t, privateKafka(t))
}
