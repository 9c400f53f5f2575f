package backends_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// parseURL checks raw as Validate does, with a group.
func parseURL(raw string) error { return backends.Config{URL: raw, Group: "g"}.Validate() }

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		broker brokerkit.Broker
		want   string // a part of the error; "" for none
	}{
		{url: "kafka://localhost:9092", broker: brokerkit.Kafka},
		{url: "kafka://k1:9092,k2:9093,k3", broker: brokerkit.Kafka},
		{url: "kafka://k1,k2:9092", broker: brokerkit.Kafka},
		{url: "KAFKA://k1:9092/", broker: brokerkit.Kafka},
		{url: "kafka://[::1]:9092", broker: brokerkit.Kafka},
		{url: "kafka://k1:9092?partitions=3&replication_factor=1&version=3.6.0", broker: brokerkit.Kafka},
		{url: "redis://localhost:6379/0", broker: brokerkit.RedisStreams},
		{url: "redis://user:secret@localhost:6379/3", broker: brokerkit.RedisStreams},
		{url: "rediss://cache.example.com:6380/0", broker: brokerkit.RedisStreams},
		{url: "redis://localhost", broker: brokerkit.RedisStreams},
		{url: "redis://localhost:6379/0?max_idle_time=90s&claim_interval=1s&maxlen=1000&pool_size=4", broker: brokerkit.RedisStreams},
		{url: "amqp://guest:guest@localhost:5672/", broker: brokerkit.AMQP},
		{url: "amqp://user:pass@rabbit:5672/vhost", broker: brokerkit.AMQP},
		{url: "amqps://user:pass@rabbit:5671/vhost", broker: brokerkit.AMQP},
		{url: "amqp://guest:guest@localhost:5672/?prefetch=8&publish_groups=billing,shipping", broker: brokerkit.AMQP},
		{url: "nats://localhost:4222", broker: brokerkit.NATS},
		{url: "nats://n1:4222,n2:4222", broker: brokerkit.NATS},
		{url: "nats://user:pass@n1:4222", broker: brokerkit.NATS},
		{url: "nats://n1:4222?ack_wait=2m&max_ack_pending=50", broker: brokerkit.NATS},
		{url: "gochannel://", broker: brokerkit.GoChannel},

		{url: "", want: "empty broker URL"},
		{url: "   ", want: "empty broker URL"},
		{url: "localhost:9092", want: "without scheme://"},
		{url: "kafka:localhost", want: "without scheme://"},
		{url: "pulsar://localhost:6650", want: `unknown broker scheme "pulsar"`},
		{url: "http://localhost", want: "unknown broker scheme"},
		{url: "kafka://", want: "an empty host"},
		{url: "kafka://k1:9092,,k2:9092", want: "an empty host"},
		{url: "kafka://k1:notaport", want: "a bad port"},
		{url: "kafka://k1:70000", want: "a bad port"},
		{url: "kafka://k1:9092/topic", want: "no path"},
		{url: "kafka://k1:9092?acks=all", want: "no path, other query"},
		{url: "kafka://k1:9092?partitions=-3", want: `partitions="-3" is negative`},
		{url: "kafka://k1:9092?partitions=three", want: `partitions="three" is not a 32-bit integer`},
		{url: "kafka://k1:9092?replication_factor=70000", want: "is not a 16-bit integer"},
		{url: "kafka://k1:9092?version=latest", want: `version="latest" is not a Kafka version`},
		{url: "kafka://k1:9092?partitions=3&partitions=4", want: "the parameter partitions twice"},
		{url: "kafka://user:pass@k1:9092", want: "not in the URL"},
		{url: "redis://localhost:6379/notadb", want: "go-redis cannot parse it"},
		{url: "redis://localhost:6379/0?unknown_option=1", want: "go-redis cannot parse it"},
		{url: "redis://localhost:6379/0?max_idle_time=60", want: `max_idle_time="60" is not a duration`},
		{url: "redis://localhost:6379/0?claim_interval=-1s", want: "is negative"},
		{url: "redis://localhost:6379/0?maxlen=1e6", want: "is not a 64-bit integer"},
		{url: "amqp://guest:guest@localhost:notaport/", want: "a bad port"},
		{url: "amqp://guest:guest@localhost:5672/?prefetch=x", want: `prefetch="x"`},
		{url: "amqp://guest:guest@localhost:5672/?prefetch=%zz", want: "does not unescape"},
		{url: "nats://", want: "an empty host"},
		{url: "nats://n1:4222/path", want: "no path"},
		{url: "nats://n1:4222?ack_wait=forever", want: `ack_wait="forever"`},
		{url: "nats://n1:4222?max_ack_pending=-", want: "max_ack_pending"},
		{url: "nats://n1:4222?ack_wait=1s&max_ack_pending=-1", want: `max_ack_pending="-1" is negative`},
		{url: "gochannel://somewhere", want: "gochannel takes nothing"},
		{url: "gochannel://?x=1", want: "gochannel takes nothing"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			err := parseURL(tc.url)
			if tc.want != "" {
				require.ErrorIs(t, err, backends.ErrInvalidConfig)
				assert.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			b, err := backends.BrokerOf(tc.url)
			require.NoError(t, err)
			assert.Equal(t, tc.broker, b)
		})
	}
}

// The backend's parameters are read, defaults filled, and taken out of the
// URL that the client library gets; the library's own options stay.
func TestParseURL_Parameters(t *testing.T) {
	ep, err := backends.ParseEndpoint("redis://u:p@localhost:6379/0?pool_size=4&max_idle_time=90s&maxlen=10")
	require.NoError(t, err)
	assert.Equal(t, "redis://u:p@localhost:6379/0?pool_size=4", ep.URL)
	assert.Equal(t, 90*time.Second, ep.Redelivery)
	ep, err = backends.ParseEndpoint("redis://localhost:6379/0")
	require.NoError(t, err)
	assert.Equal(t, 60*time.Second, ep.Redelivery, "the default max_idle_time")

	ep, err = backends.ParseEndpoint("nats://n1:4222,n2?ack_wait=2m")
	require.NoError(t, err)
	assert.Equal(t, "nats://n1:4222,nats://n2:4222", ep.URL)
	assert.Equal(t, 2*time.Minute, ep.Redelivery)

	ep, err = backends.ParseEndpoint("amqp://guest:guest@localhost:5672/vh?heartbeat=5&publish_groups=a,,b&prefetch=0")
	require.NoError(t, err)
	assert.Equal(t, "amqp://guest:guest@localhost:5672/vh?heartbeat=5", ep.URL)
	assert.Zero(t, ep.Redelivery)

	ep, err = backends.ParseEndpoint("kafka://k1:9092?partitions=0")
	require.NoError(t, err, "zero means the default")
	assert.Equal(t, "kafka://k1:9092", ep.URL)
}

// Every broker refuses a port outside 1 to 65535, with the same words:
// go-redis and amqp091 took 0 and ports up to 99999, and New then failed
// to dial.
func TestParseURL_Port(t *testing.T) {
	urls := map[string]string{
		"kafka": "kafka://k1:%s", "kafka list": "kafka://k1:9092,k2:%s",
		"redis": "redis://user:pw@cache:%s/0", "rediss": "rediss://cache:%s",
		"amqp": "amqp://guest:guest@rabbit:%s/", "amqps": "amqps://rabbit:%s/vhost",
		"nats": "nats://n1:%s", "nats list": "nats://n1:%s,n2:4222", "ipv6": "redis://[::1]:%s/0",
	}
	for name, format := range urls {
		for _, port := range []string{"1", "65535", "08", ""} {
			err := parseURL(fmt.Sprintf(format, port))
			assert.NoError(t, err, "%s, port %q", name, port)
		}
		for _, port := range []string{"0", "65536", "70000", "99999", "18446744073709551617", "-1", "+80", "0x50", "80a", " 80", "1_000"} {
			raw := fmt.Sprintf(format, port)
			err := parseURL(raw)
			require.ErrorIs(t, err, backends.ErrInvalidConfig, raw)
			assert.Contains(t, err.Error(), "a bad port (want 1 to 65535)", raw)
			assert.NotContains(t, err.Error(), "pw", raw)
		}
	}
}

func TestParseURL_ErrorHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"amqp://guest:hunter2@localhost:notaport/",
		"redis://user:hunter2@localhost:6379/notadb",
		"redis://user:hunter2@localhost:6379/0?max_idle_time=x",
		"kafka://user:hunter2@k1:9092",
		"nats://user:hunter2@n1:4222?ack_wait=x",
	} {
		err := parseURL(raw)
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "hunter2")
	}
}

func TestConfigValidate(t *testing.T) {
	valid := backends.Config{URL: "kafka://localhost:9092", Group: "billing"}
	for _, tc := range []struct {
		name   string
		mutate func(*backends.Config)
		want   string // a part of the error; "" for none
	}{
		{name: "valid", mutate: func(*backends.Config) {}},
		{name: "zero optional fields are defaults", mutate: func(c *backends.Config) {
			*c = backends.Config{URL: c.URL, Group: c.Group}
		}},
		{name: "gochannel needs no group", mutate: func(c *backends.Config) { c.URL, c.Group = "gochannel://", "" }},
		{name: "empty URL", mutate: func(c *backends.Config) { c.URL = "" }, want: "empty broker URL"},
		{name: "unknown scheme", mutate: func(c *backends.Config) { c.URL = "sqs://queue" }, want: "unknown broker scheme"},
		{name: "kafka without group", mutate: func(c *backends.Config) { c.Group = "" }, want: "missing consumer group"},
		{name: "blank group", mutate: func(c *backends.Config) { c.Group = "  " }, want: "missing consumer group"},
		{name: "redis without group", mutate: func(c *backends.Config) { c.URL, c.Group = "redis://localhost:6379/0", "" }, want: "missing consumer group"},
		{name: "amqp without group", mutate: func(c *backends.Config) { c.URL, c.Group = "amqp://guest:guest@localhost:5672/", "" }, want: "missing consumer group"},
		{name: "nats without group", mutate: func(c *backends.Config) { c.URL, c.Group = "nats://localhost:4222", "" }, want: "missing consumer group"},
		{name: "negative nack sleep", mutate: func(c *backends.Config) { c.NackResendSleep = -time.Second }, want: "NackResendSleep is negative"},
		{name: "negative dial timeout", mutate: func(c *backends.Config) { c.DialTimeout = -1 }, want: "DialTimeout is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid
			tc.mutate(&cfg)
			err := cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, backends.ErrInvalidConfig, "every problem is an invalid config")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestConfigValidateEveryProblem: Validate reports all problems at once, in
// its documented order, each matching ErrInvalidConfig.
func TestConfigValidateEveryProblem(t *testing.T) {
	cfg := backends.Config{URL: "nats://localhost:4222?ack_wait=-2s&max_ack_pending=x", DialTimeout: -1, NackResendSleep: -3}
	err := cfg.Validate()
	require.Error(t, err)
	problems := err.(interface{ Unwrap() []error }).Unwrap()
	require.Len(t, problems, 4, err.Error())
	for _, p := range problems {
		assert.ErrorIs(t, p, backends.ErrInvalidConfig, p.Error())
	}
	assert.Equal(t, `backends: invalid config: broker URL "nats://localhost:4222": ack_wait="-2s" is negative; `+
		`max_ack_pending="x" is not a 32-bit integer`, problems[0].Error())
	assert.Equal(t, "backends: invalid config: missing consumer group: nats needs one (set BROKER_GROUP)", problems[1].Error())
	assert.Equal(t, "backends: invalid config: NackResendSleep is negative (-3ns)", problems[2].Error())
	assert.Equal(t, "backends: invalid config: DialTimeout is negative (-1ns)", problems[3].Error())

	// A URL that names no broker hides the Group problem (whether a group is
	// needed depends on the broker) but not the others.
	cfg.URL = "sqs://queue"
	err = cfg.Validate()
	assert.NotContains(t, err.Error(), "missing consumer group")
	problems = err.(interface{ Unwrap() []error }).Unwrap()
	require.Len(t, problems, 3, err.Error())
	assert.Contains(t, problems[0].Error(), "unknown broker scheme")
	assert.ErrorIs(t, problems[0], backends.ErrInvalidConfig)
}

func TestFromEnv(t *testing.T) {
	t.Setenv("BROKER_URL", " redis://localhost:6379/0?max_idle_time=90s ")
	t.Setenv("BROKER_GROUP", "billing")
	t.Setenv("BROKER_CONSUMER", "billing-7f9c")
	t.Setenv("BROKER_NACK_RESEND_SLEEP", "250ms")
	t.Setenv("BROKER_DIAL_TIMEOUT", "3s")

	cfg, err := backends.FromEnv()
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	assert.Equal(t, backends.Config{
		URL:             "redis://localhost:6379/0?max_idle_time=90s",
		Group:           "billing",
		Consumer:        "billing-7f9c",
		NackResendSleep: 250 * time.Millisecond,
		DialTimeout:     3 * time.Second,
	}, cfg)
}

func TestFromEnv_UnsetIsZero(t *testing.T) {
	for _, name := range allEnvVars {
		t.Setenv(name, "")
	}
	t.Setenv("BROKER_URL", "gochannel://")
	cfg, err := backends.FromEnv()
	require.NoError(t, err)
	assert.Equal(t, backends.Config{URL: "gochannel://"}, cfg)
	require.NoError(t, cfg.Validate())
}

func TestFromEnv_Malformed(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"BROKER_NACK_RESEND_SLEEP", "1"},
		{"BROKER_DIAL_TIMEOUT", "soon"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			for _, name := range allEnvVars {
				t.Setenv(name, "")
			}
			t.Setenv("BROKER_URL", "kafka://localhost:9092")
			t.Setenv(tc.name, tc.value)
			_, err := backends.FromEnv()
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.name)
		})
	}
}

var allEnvVars = []string{"BROKER_URL", "BROKER_GROUP", "BROKER_CONSUMER", "BROKER_NACK_RESEND_SLEEP", "BROKER_DIAL_TIMEOUT"}

func TestNew_BadConfig(t *testing.T) {
	_, err := backends.New(backends.Config{URL: "mqtt://broker:1883", Group: "g"}, nil)
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "mqtt")

	_, err = backends.New(backends.Config{URL: "nats://localhost:4222"}, nil)
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "BROKER_GROUP")

	_, err = backends.New(backends.Config{URL: "kafka://localhost:x", Group: "g"}, nil)
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.NotErrorIs(t, err, backends.ErrUnreachable)
}

// TestNew_Unreachable needs no server: it points every broker at a loopback
// port nobody listens on, and at an address that drops packets.
func TestNew_Unreachable(t *testing.T) {
	t.Parallel()
	port := closedPort(t)
	closed := "127.0.0.1:" + strconv.Itoa(port)
	for _, tc := range []struct{ name, url string }{
		{"kafka", "kafka://" + closed},
		{"kafka list", "kafka://" + closed + "," + closed},
		{"redis", "redis://" + closed + "/0"},
		{"amqp", "amqp://guest:guest@" + closed + "/"},
		{"nats", "nats://" + closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			b, err := backends.New(backends.Config{URL: tc.url, Group: "g", DialTimeout: 2 * time.Second}, nil)
			require.ErrorIs(t, err, backends.ErrUnreachable)
			assert.Nil(t, b)
			assert.Contains(t, err.Error(), closed)
			assert.NotContains(t, err.Error(), "guest:guest")
			// A generous bound: the point is that New gives up, not how fast.
			assert.Less(t, time.Since(start), 30*time.Second)
		})
	}
}

// TestNew_UnreachableBlackhole checks the bound when nothing answers at all
// (a dial that hangs rather than being refused). 192.0.2.0/24 is TEST-NET-1,
// reserved for documentation: packets to it go nowhere, or are refused at
// once by a host without a route; either way New must return ErrUnreachable.
func TestNew_UnreachableBlackhole(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"kafka://192.0.2.1:9092", "redis://192.0.2.1:6379/0", "amqp://guest:guest@192.0.2.1:5672/", "nats://192.0.2.1:4222"} {
		t.Run(url, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			_, err := backends.New(backends.Config{URL: url, Group: "g", DialTimeout: 500 * time.Millisecond}, nil)
			require.ErrorIs(t, err, backends.ErrUnreachable)
			assert.Contains(t, err.Error(), "192.0.2.1")
			assert.Less(t, time.Since(start), 30*time.Second)
		})
	}
}

// A broker that answers and refuses the connection (a wrong password, a
// database or virtual host it lacks) is an ErrInvalidConfig, not an
// ErrUnreachable: the same Config never succeeds, where ErrUnreachable says
// it may once the broker is up. Both were ErrUnreachable ("redis at … (within
// 5s): ERR DB index is out of range").
func TestNew_Refused(t *testing.T) {
	t.Parallel()
	redisAddr := testserver.RedisAddr(t)
	withPassword := testserver.StartRedis(t, "--requirepass", "right")
	limited := redis.NewClient(&redis.Options{Addr: withPassword.Addr, Password: "right"})
	defer limited.Close()
	require.NoError(t, limited.Do(context.Background(), "ACL", "SETUSER", "limited", "on", ">s3cr3t-limited",
		"-@all", "+hello", "+auth", "+client", "+select").Err())
	cluster := testserver.StartRedis(t, "--cluster-enabled", "yes")
	amqpHost := strings.TrimSuffix(testserver.RabbitMQURL(t)[strings.LastIndex(testserver.RabbitMQURL(t), "@")+1:], "/")
	natsAuth := testserver.StartNATS(t, "--user", "natsuser", "--pass", "right")
	natsHost := strings.TrimPrefix(natsAuth.URL, "nats://")

	for _, tc := range []struct{ name, url, says string }{
		{"redis database", "redis://" + redisAddr + "/999", "DB index is out of range"},
		{"redis password", "redis://:s3cr3t-wrong@" + withPassword.Addr + "/0", "WRONGPASS"},
		{"redis no password", "redis://" + withPassword.Addr + "/0", "NOAUTH"},
		{"redis permission", "redis://limited:s3cr3t-limited@" + withPassword.Addr + "/0", "NOPERM"},
		{"redis cluster database", "redis://" + cluster.Addr + "/1", "SELECT is not allowed in cluster mode"},
		{"amqp password", "amqp://guest:s3cr3t-wrong@" + amqpHost + "/", "403"},
		{"amqp vhost", "amqp://guest:guest@" + amqpHost + "/no-vhost-" + backendtest.RunID, "403"},
		{"nats password", "nats://natsuser:s3cr3t-wrong@" + natsHost, "Authorization Violation"},
		{"nats no password", "nats://" + natsHost, "Authorization Violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := backends.New(backends.Config{URL: tc.url, Group: "g", DialTimeout: 10 * time.Second}, nil)
			assert.Nil(t, b)
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			assert.NotErrorIs(t, err, backends.ErrUnreachable)
			assert.Contains(t, err.Error(), "refused the connection")
			assert.Contains(t, err.Error(), tc.says)
			assert.NotContains(t, err.Error(), "s3cr3t")
		})
	}
}

// An answer that may change is still ErrUnreachable: Redis busy running a
// script, and a RabbitMQ handshake that runs out of DialTimeout, which
// amqp091 reports as the 403 of a wrong password.
func TestNew_RefusedOnlyForGood(t *testing.T) {
	t.Parallel()
	busy := testserver.StartRedis(t, "--busy-reply-threshold", "50")
	ctx := context.Background()
	script := redis.NewClient(&redis.Options{Addr: busy.Addr})
	defer script.Close()
	go script.Eval(ctx, "while true do end", nil)
	admin := redis.NewClient(&redis.Options{Addr: busy.Addr, MaxRetries: -1})
	defer admin.Close()
	require.Eventually(t, func() bool { return redis.HasErrorPrefix(admin.Ping(ctx).Err(), "BUSY") }, 10*time.Second, 10*time.Millisecond)
	_, err := backends.New(backends.Config{URL: "redis://" + busy.Addr + "/0", Group: "g", DialTimeout: 5 * time.Second}, nil)
	require.ErrorIs(t, err, backends.ErrUnreachable)
	assert.Contains(t, err.Error(), "BUSY")
	require.NoError(t, admin.ScriptKill(ctx).Err())

	// Each leg 600 ms late: connection.tune, the second round trip, comes
	// after 2.4 s.
	amqpURL := testserver.RabbitMQURL(t)
	slow := testserver.StartFaultProxy(t, amqpURL[strings.LastIndex(amqpURL, "@")+1:len(amqpURL)-1])
	slow.SetLatency(600 * time.Millisecond)
	_, err = backends.New(backends.Config{URL: "amqp://guest:guest@" + slow.Addr + "/", Group: "g", DialTimeout: 2 * time.Second}, nil)
	require.ErrorIs(t, err, backends.ErrUnreachable)
	assert.NotErrorIs(t, err, backends.ErrInvalidConfig)
}

// closedPort returns a loopback port that was just freed, so a dial to it is
// refused.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

func TestErrorsAreDistinct(t *testing.T) {
	all := []error{backends.ErrInvalidConfig, backends.ErrUnreachable, backends.ErrDuplicatePublish, backends.ErrUnroutable}
	for i, a := range all {
		for j, b := range all {
			assert.Equal(t, i == j, errors.Is(a, b), "%v vs %v", a, b)
		}
	}
}

// A NATS password or token holding an unescaped '?', '#' or '/', or a bad
// percent escape, is refused by Validate, before New dials: nats.go parsed
// the URL again, read part of the password as the port or the host, and
// New's error quoted it (`invalid port ":s3cr3t" after host`, `address
// s3cr3t: missing port`).
func TestNew_NATSUserinfoThatNATSCannotParse(t *testing.T) {
	t.Parallel()
	hostPort := strings.TrimPrefix(testserver.NATSURL(t), "nats://")
	for _, userinfo := range []string{
		"user:s3cr3t?tail", "user:s3cr3t#tail", "user:s3cr3t/tail", "s3cr3t/tail", "s3cr3t%zz", "user:s3cr3t%",
	} {
		raw := "nats://" + userinfo + "@" + hostPort
		err := parseURL(raw)
		require.ErrorIs(t, err, backends.ErrInvalidConfig, userinfo)
		assert.NotContains(t, err.Error(), "s3cr3t", userinfo)
		b, err := backends.New(backends.Config{URL: raw, Group: "g", DialTimeout: 5 * time.Second}, nil)
		if b != nil {
			_ = b.Close()
		}
		require.Error(t, err, userinfo)
		assert.NotContains(t, err.Error(), "s3cr3t", userinfo)
	}
	// Percent-encoded, the same characters are fine.
	require.NoError(t, parseURL("nats://user:s3cr3t%3Ftail%23%2F@"+hostPort))
}
