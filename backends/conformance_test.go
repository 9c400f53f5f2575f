package backends_test

import (
	"fmt"
	"hash/fnv"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
)

// Watermill's own Pub/Sub conformance suite, run against what backends.New
// builds for each broker. The servers are shared, so every run isolates
// itself: topics are unique per test (the suite names them after a UUID), and
// groups are unique per run and per test.

// runID keeps this run's consumer groups apart from other runs' on the shared
// servers.
var runID = watermill.NewShortUUID()

// testLogger is silent unless BACKENDS_TEST_LOG is set.
func testLogger() watermill.LoggerAdapter {
	if os.Getenv("BACKENDS_TEST_LOG") != "" {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}

// groupFor returns one group per test: every constructor call of one suite
// test shares it, as the processes of one service would, while tests running
// in parallel on other topics do not join it (in Kafka a group spans topics,
// and every member that joins makes the whole group rebalance).
func groupFor(t *testing.T) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(t.Name()))
	return fmt.Sprintf("g-%s-%08x", runID, h.Sum32())
}

// conformance runs tests.TestPubSub on base (with Group filled per test), and
// then, for brokers where a new group starts from the oldest message,
// TestNewSubscriberReceivesOldMessages with a fresh group per constructor
// call: that test needs each subscriber to see every message, which with one
// shared group would be a bug.
func conformance(t *testing.T, base backends.Config, features tests.Features, newGroupReadsHistory bool) {
	t.Helper()
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		cfg := base
		if base.Group != "" || group != "" {
			cfg.Group = group
		}
		b, err := backends.New(cfg, testLogger())
		require.NoError(t, err)
		return b.Publisher, b.Subscriber
	}
	perTest := func(t *testing.T) (message.Publisher, message.Subscriber) {
		if features.ConsumerGroups {
			return withGroup(t, groupFor(t))
		}
		return withGroup(t, "")
	}
	var cgCtor tests.ConsumerGroupPubSubConstructor
	if features.ConsumerGroups {
		cgCtor = withGroup
	}
	tests.TestPubSub(t, features, perTest, cgCtor)

	if newGroupReadsHistory {
		t.Run("TestNewSubscriberReceivesOldMessages_freshGroups", func(t *testing.T) {
			t.Parallel()
			f := features
			f.NewSubscriberReceivesOldMessages = true
			fresh := func(t *testing.T) (message.Publisher, message.Subscriber) {
				return withGroup(t, "fresh-"+watermill.NewShortUUID())
			}
			tests.TestNewSubscriberReceivesOldMessages(t, tests.TestContext{TestID: tests.NewTestID(), Features: f}, fresh)
		})
	}
}

// fastNack keeps the suite's nack tests quick; production keeps the 1 s default.
const fastNack = 50 * time.Millisecond

func TestConformance_GoChannel(t *testing.T) {
	t.Parallel()
	conformance(t, backends.Config{URL: "gochannel://", NackResendSleep: fastNack}, tests.Features{
		ConsumerGroups:        false,
		ExactlyOnceDelivery:   true,
		GuaranteedOrder:       false,
		Persistent:            false, // messages live in one instance only
		RequireSingleInstance: true,
		ForceShort:            true,
	}, false)
}
