// Package backendtest holds the helpers that the tests of package backends
// and of its broker packages share: a Backend that closes when the test
// ends, topics and groups of this run's own on the shared servers, and
// publishing and receiving with a bound on the wait. It links no broker:
// each test package imports the brokers it tests.
package backendtest

import (
	"context"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// RunID keeps this run's topics and consumer groups apart from other runs'
// on the shared servers.
var RunID = watermill.NewShortUUID()

// FastNack keeps nack tests quick; production keeps the 1 s default.
const FastNack = 50 * time.Millisecond

// Logger is silent unless BACKENDS_TEST_LOG is set.
func Logger() watermill.LoggerAdapter {
	if os.Getenv("BACKENDS_TEST_LOG") != "" {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}

// NewBackend is backends.New, closed when the test ends.
func NewBackend(t *testing.T, cfg backends.Config) *backends.Backend {
	t.Helper()
	b, err := backends.New(cfg, Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// UniqueTopic is a topic of this run's own.
func UniqueTopic(prefix string) string { return prefix + "-" + RunID + "-" + watermill.NewShortUUID() }

// Publish publishes one message per payload.
func Publish(t *testing.T, pub message.Publisher, topic string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		require.NoError(t, pub.Publish(topic, NewMessage(p)))
	}
}

// NewMessage is a message with a fresh UUID.
func NewMessage(payload string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(payload))
}

// Subscribe subscribes b to topic.
func Subscribe(t *testing.T, b *backends.Backend, topic string) <-chan *message.Message {
	t.Helper()
	msgs, err := b.Subscriber.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	return msgs
}

// Next returns the next message within 15 s.
func Next(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-msgs:
		require.NotNil(t, m, "channel closed")
		return m
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15 s")
		return nil
	}
}

// Receive reads one message, acks it and returns its payload.
func Receive(t *testing.T, msgs <-chan *message.Message) string {
	t.Helper()
	m := Next(t, msgs)
	m.Ack()
	return string(m.Payload)
}

// NothingFor fails if a message arrives within d.
func NothingFor(t *testing.T, msgs <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case m := <-msgs:
		if m != nil {
			t.Fatalf("unexpected message %q", m.Payload)
		}
	case <-time.After(d):
	}
}

// sampleURLs are a URL of each broker that lives in a package of its own,
// with the package that links it. None is dialled.
var sampleURLs = []struct {
	broker brokerkit.Broker
	url    string
	pkg    string
}{
	{brokerkit.Kafka, "kafka://127.0.0.1:9092?partitions=3", "kafkabackend"},
	{brokerkit.RedisStreams, "redis://127.0.0.1:6379/0?max_idle_time=90s", "redisbackend"},
	{brokerkit.AMQP, "amqp://guest:s3cr3t@127.0.0.1:5672/?prefetch=4", "amqpbackend"},
	{brokerkit.NATS, "nats://127.0.0.1:4222?ack_wait=2m", "natsbackend"},
}

// NotLinked checks the brokers of a test binary that links linked alone:
// its URLs are valid, and a URL of any other broker is refused by
// Config.Validate and New with an ErrInvalidConfig that names the import to
// add and the brokers the program links, before New dials anything.
func NotLinked(t *testing.T, linked brokerkit.Broker) {
	t.Helper()
	links := strings.Join(slices.Sorted(slices.Values([]string{"gochannel", string(linked)})), ", ")
	// An empty URL, or one without a scheme, names the brokers the program
	// links, not one it may not.
	for _, raw := range []string{"", "localhost:6379"} {
		err := backends.Config{URL: raw}.Validate()
		require.ErrorIs(t, err, backends.ErrInvalidConfig)
		require.ErrorContains(t, err, "a broker this program links: "+links)
	}
	for _, s := range sampleURLs {
		t.Run(string(s.broker), func(t *testing.T) {
			cfg := backends.Config{URL: s.url, Group: "g"}
			if s.broker == linked {
				require.NoError(t, cfg.Validate())
				return
			}
			want := `backends: broker "` + string(s.broker) + `" is not linked: ` +
				`import _ "github.com/idempotency/watermill-idempotency/backends/` + s.pkg + `"`
			err := cfg.Validate()
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			require.ErrorContains(t, err, want)
			require.ErrorContains(t, err, "(this program links "+links+")")
			require.NotContains(t, err.Error(), "s3cr3t")
			require.NotContains(t, err.Error(), "unknown broker")

			// Without a group, Validate names both fixes.
			cfg.Group = ""
			err = cfg.Validate()
			require.ErrorContains(t, err, want)
			require.ErrorContains(t, err, "missing consumer group")

			// New refuses it before any dial: nothing listens at these
			// addresses, which would be ErrUnreachable.
			cfg.Group = "g"
			b, err := backends.New(cfg, nil)
			require.Nil(t, b)
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			require.ErrorContains(t, err, want)
			require.NotErrorIs(t, err, backends.ErrUnreachable)
		})
	}
}

// WithParams adds the backend's URL parameters to raw's query: pairs of a
// name and a value, which it escapes.
func WithParams(raw string, pairs ...string) string {
	for i := 0; i+1 < len(pairs); i += 2 {
		sep := "?"
		if strings.Contains(raw, "?") {
			sep = "&"
		}
		raw += sep + pairs[i] + "=" + url.QueryEscape(pairs[i+1])
	}
	return raw
}
