package backends_test

import (
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// An AMQP URL is refused with an ErrInvalidConfig, or read as meant:
// never half read.
func TestParseURL_AMQPQuery(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want string // a part of the error; "" for none
	}{
		// Another broker's parameter, a misspelt one, or one that does not
		// unescape: amqp091 ignores what it does not know.
		{url: "amqp://guest:guest@localhost:5672/?ack_wait=1s", want: "unknown parameter ack_wait"},
		{url: "amqp://guest:guest@localhost:5672/?prefech=8", want: "unknown parameter prefech"},
		{url: "amqp://guest:guest@localhost:5672/?heartbeat=%zz", want: "does not unescape"},
		{url: "amqp://guest:guest@localhost:5672/?heartbeat=5&channel_max=10&auth_mechanism=PLAIN"},
		{url: "amqps://guest:guest@localhost:5671/?cacertfile=/ca.pem&server_name_indication=rabbit"},
		// An amqp091 option that the backend's DialTimeout overrides.
		{url: "amqp://guest:guest@localhost:5672/?connection_timeout=1000", want: "DialTimeout"},
		// AMQP's prefetch count is 16 bits: amqp091 cut 65536 to 0, no limit.
		{url: "amqp://guest:guest@localhost:5672/?prefetch=65535"},
		{url: "amqp://guest:guest@localhost:5672/?prefetch=65536", want: "prefetch=65536"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			err := parseURL(tc.url)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A parameter name written percent-encoded is the same parameter.
func TestParseURL_EscapedParameterName(t *testing.T) {
	ep, err := backends.ParseEndpoint("redis://localhost:6379/0?max%5Fidle%5Ftime=90s")
	require.NoError(t, err)
	assert.Equal(t, 90*time.Second, ep.Redelivery)
	assert.Equal(t, "redis://localhost:6379/0", ep.URL)
}

// A Consumer name is any text: Redis refuses a client name with a space or
// a byte outside printable ASCII, and the backend must not pass it on.
func TestNew_RedisConsumerAnyText(t *testing.T) {
	t.Parallel()
	b := backendtest.NewBackend(t, backends.Config{
		URL:      "redis://" + testserver.RedisAddr(t) + "/0",
		Group:    "odd-consumer-" + backendtest.RunID,
		Consumer: "billing worker ü",
	})
	topic := backendtest.UniqueTopic("odd-consumer")
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))
}

// Tune may replace the whole client configuration: the backend must not
// rely on a field Tune cleared.
func TestTune_AMQPReplacesConfig(t *testing.T) {
	t.Parallel()
	b := backendtest.NewBackend(t, backends.Config{
		URL:   testserver.RabbitMQURL(t),
		Group: "tune-replace-" + backendtest.RunID,
		Tune:  func(c any) { *c.(*amqp091.Config) = amqp091.Config{Locale: "en_US"} },
	})
	topic := backendtest.UniqueTopic("tune-replace")
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))
}

// A Tune that makes sarama's configuration unusable is an ErrInvalidConfig:
// no retry mends it.
func TestTune_KafkaBadProducerConfig(t *testing.T) {
	t.Parallel()
	_, err := backends.New(backends.Config{
		URL:   "kafka://" + strings.Join(testserver.KafkaBrokers(t), ","),
		Group: "tune-bad-" + backendtest.RunID,
		Tune: func(c any) {
			c.(*sarama.Config).Producer.Return.Successes = false
		},
	}, nil)
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.NotErrorIs(t, err, backends.ErrUnreachable)
}

// Odd group and consumer names (colons, dots, unicode, very long) work on
// every broker, and one Config builds two Backends, each closed twice.
func TestOddNames(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("g", 300)
	for _, tc := range []struct{ name, url string }{
		{"kafka", "kafka://" + strings.Join(testserver.KafkaBrokers(t), ",")},
		{"redis", "redis://" + testserver.RedisAddr(t) + "/0"},
		{"amqp", testserver.RabbitMQURL(t)},
		{"nats", testserver.NATSURL(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var tuned atomic.Int32
			cfg := backends.Config{
				URL:             tc.url,
				Group:           "svc:billing.v2-ü-" + backendtest.RunID,
				Consumer:        "host:1.pod-ü-" + long,
				NackResendSleep: backendtest.FastNack,
				Tune:            func(any) { tuned.Add(1) },
			}
			first, err := backends.New(cfg, backendtest.Logger())
			require.NoError(t, err)
			second, err := backends.New(cfg, backendtest.Logger())
			require.NoError(t, err)

			topic := backendtest.UniqueTopic("odd.names:ü")
			msgs := backendtest.Subscribe(t, first, topic)
			other, err := first.SubscriberForGroup(cfg.Group + "." + long)
			require.NoError(t, err)
			otherMsgs, err := other.Subscribe(t.Context(), topic)
			require.NoError(t, err)
			backendtest.Publish(t, second.Publisher, topic, "one")
			assert.Equal(t, "one", backendtest.Receive(t, msgs))
			assert.Equal(t, "one", backendtest.Receive(t, otherMsgs))

			for _, b := range []*backends.Backend{first, second} {
				require.NoError(t, b.Close())
				require.NoError(t, b.Close(), "Close again")
			}
			assert.GreaterOrEqual(t, tuned.Load(), int32(4))
		})
	}
}

// A client library option that the server refuses for good is an
// ErrInvalidConfig too, as a Kafka version too old for consumer groups.
func TestNew_LibraryOptionRefused(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://" + testserver.RedisAddr(t) + "/0?client_name=billing%20worker",
		"kafka://" + strings.Join(testserver.KafkaBrokers(t), ",") + "?version=0.8.2.0",
	} {
		b, err := backends.New(backends.Config{URL: raw, Group: "refused-" + backendtest.RunID}, nil)
		if err == nil {
			_, err = b.Subscriber.Subscribe(t.Context(), backendtest.UniqueTopic("refused"))
			_ = b.Close()
		}
		assert.ErrorIs(t, err, backends.ErrInvalidConfig, raw)
		assert.NotErrorIs(t, err, backends.ErrUnreachable, raw)
	}
}

// hangingAddr is a loopback address whose dial hangs: a listener that never
// accepts, with a full accept queue, drops every further SYN.
func hangingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
	for i := 0; ; i++ {
		require.Less(t, i, 16, "the accept queue never filled")
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			return addr
		}
		t.Cleanup(func() { _ = c.Close() })
	}
}

// A host list answers when one of its hosts does, even if the one before
// it hangs until DialTimeout.
func TestNew_HostListWithAHangingHost(t *testing.T) {
	t.Parallel()
	hang := hangingAddr(t)
	for _, tc := range []struct{ name, url string }{
		{"kafka", "kafka://" + hang + "," + strings.Join(testserver.KafkaBrokers(t), ",")},
		{"nats", "nats://" + hang + "," + strings.TrimPrefix(testserver.NATSURL(t), "nats://")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			backendtest.NewBackend(t, backends.Config{URL: tc.url, Group: "hang-" + backendtest.RunID, DialTimeout: 3 * time.Second})
		})
	}
}
