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
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url     string
		broker  backends.Broker
		wantErr error
	}{
		{url: "kafka://localhost:9092", broker: backends.Kafka},
		{url: "kafka://k1:9092,k2:9093,k3", broker: backends.Kafka},
		{url: "kafka://k1,k2:9092", broker: backends.Kafka},
		{url: "KAFKA://k1:9092/", broker: backends.Kafka},
		{url: "kafka://[::1]:9092", broker: backends.Kafka},
		{url: "redis://localhost:6379/0", broker: backends.RedisStreams},
		{url: "redis://user:secret@localhost:6379/3", broker: backends.RedisStreams},
		{url: "rediss://cache.example.com:6380/0", broker: backends.RedisStreams},
		{url: "redis://localhost", broker: backends.RedisStreams},
		{url: "amqp://guest:guest@localhost:5672/", broker: backends.AMQP},
		{url: "amqp://user:pass@rabbit:5672/vhost", broker: backends.AMQP},
		{url: "amqps://user:pass@rabbit:5671/vhost", broker: backends.AMQP},
		{url: "nats://localhost:4222", broker: backends.NATS},
		{url: "nats://n1:4222,n2:4222", broker: backends.NATS},
		{url: "nats://user:pass@n1:4222", broker: backends.NATS},
		{url: "gochannel://", broker: backends.GoChannel},

		{url: "", wantErr: backends.ErrInvalidURL},
		{url: "   ", wantErr: backends.ErrInvalidURL},
		{url: "localhost:9092", wantErr: backends.ErrInvalidURL},
		{url: "kafka:localhost", wantErr: backends.ErrInvalidURL},
		{url: "pulsar://localhost:6650", wantErr: backends.ErrUnknownBroker},
		{url: "http://localhost", wantErr: backends.ErrUnknownBroker},
		{url: "kafka://", wantErr: backends.ErrInvalidURL},
		{url: "kafka://k1:9092,,k2:9092", wantErr: backends.ErrInvalidURL},
		{url: "kafka://k1:notaport", wantErr: backends.ErrInvalidURL},
		{url: "kafka://k1:70000", wantErr: backends.ErrInvalidURL},
		{url: "kafka://k1:9092/topic", wantErr: backends.ErrInvalidURL},
		{url: "kafka://k1:9092?partitions=3", wantErr: backends.ErrInvalidURL},
		{url: "kafka://user:pass@k1:9092", wantErr: backends.ErrInvalidURL},
		{url: "redis://localhost:6379/notadb", wantErr: backends.ErrInvalidURL},
		{url: "redis://localhost:6379/0?unknown_option=1", wantErr: backends.ErrInvalidURL},
		{url: "amqp://guest:guest@localhost:notaport/", wantErr: backends.ErrInvalidURL},
		{url: "nats://", wantErr: backends.ErrInvalidURL},
		{url: "nats://n1:4222/path", wantErr: backends.ErrInvalidURL},
		{url: "gochannel://somewhere", wantErr: backends.ErrInvalidURL},
		{url: "gochannel://?x=1", wantErr: backends.ErrInvalidURL},
	} {
		t.Run(tc.url, func(t *testing.T) {
			cfg, err := backends.ParseURL(tc.url)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.url, cfg.URL)
			b, err := cfg.Broker()
			require.NoError(t, err)
			assert.Equal(t, tc.broker, b)
		})
	}
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
			_, err := backends.ParseURL(fmt.Sprintf(format, port))
			assert.NoError(t, err, "%s, port %q", name, port)
		}
		for _, port := range []string{"0", "65536", "70000", "99999", "18446744073709551617", "-1", "+80", "0x50", "80a", " 80", "1_000"} {
			raw := fmt.Sprintf(format, port)
			_, err := backends.ParseURL(raw)
			require.ErrorIs(t, err, backends.ErrInvalidURL, raw)
			assert.Contains(t, err.Error(), "a bad port (want 1 to 65535)", raw)
			assert.NotContains(t, err.Error(), "pw", raw)
		}
	}
}

func TestParseURL_ErrorHidesPassword(t *testing.T) {
	for _, raw := range []string{
		"amqp://guest:hunter2@localhost:notaport/",
		"redis://user:hunter2@localhost:6379/notadb",
		"kafka://user:hunter2@k1:9092",
	} {
		_, err := backends.ParseURL(raw)
		require.Error(t, err)
		assert.NotContains(t, err.Error(), "hunter2")
	}
}

func TestConfigValidate(t *testing.T) {
	valid := backends.Config{URL: "kafka://localhost:9092", Group: "billing"}
	for _, tc := range []struct {
		name    string
		mutate  func(*backends.Config)
		wantErr error
	}{
		{name: "valid", mutate: func(*backends.Config) {}},
		{name: "zero optional fields are defaults", mutate: func(c *backends.Config) {
			*c = backends.Config{URL: c.URL, Group: c.Group}
		}},
		{name: "gochannel needs no group", mutate: func(c *backends.Config) { c.URL, c.Group = "gochannel://", "" }},
		{name: "empty URL", mutate: func(c *backends.Config) { c.URL = "" }, wantErr: backends.ErrInvalidURL},
		{name: "unknown scheme", mutate: func(c *backends.Config) { c.URL = "sqs://queue" }, wantErr: backends.ErrUnknownBroker},
		{name: "kafka without group", mutate: func(c *backends.Config) { c.Group = "" }, wantErr: backends.ErrMissingGroup},
		{name: "blank group", mutate: func(c *backends.Config) { c.Group = "  " }, wantErr: backends.ErrMissingGroup},
		{name: "redis without group", mutate: func(c *backends.Config) { c.URL, c.Group = "redis://localhost:6379/0", "" }, wantErr: backends.ErrMissingGroup},
		{name: "amqp without group", mutate: func(c *backends.Config) { c.URL, c.Group = "amqp://guest:guest@localhost:5672/", "" }, wantErr: backends.ErrMissingGroup},
		{name: "nats without group", mutate: func(c *backends.Config) { c.URL, c.Group = "nats://localhost:4222", "" }, wantErr: backends.ErrMissingGroup},
		{name: "negative nack sleep", mutate: func(c *backends.Config) { c.NackResendSleep = -time.Second }, wantErr: backends.ErrInvalidConfig},
		{name: "negative dial timeout", mutate: func(c *backends.Config) { c.DialTimeout = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "negative partitions", mutate: func(c *backends.Config) { c.Kafka.Partitions = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "negative replication", mutate: func(c *backends.Config) { c.Kafka.ReplicationFactor = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "bad kafka version", mutate: func(c *backends.Config) { c.Kafka.Version = "latest" }, wantErr: backends.ErrInvalidConfig},
		{name: "negative max idle", mutate: func(c *backends.Config) { c.Redis.MaxIdleTime = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "negative claim interval", mutate: func(c *backends.Config) { c.Redis.ClaimInterval = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "negative maxlen", mutate: func(c *backends.Config) { c.Redis.MaxLen = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "negative prefetch", mutate: func(c *backends.Config) { c.AMQP.Prefetch = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "empty publish group", mutate: func(c *backends.Config) { c.AMQP.PublishGroups = []string{"a", ""} }, wantErr: backends.ErrInvalidConfig},
		{name: "negative ack wait", mutate: func(c *backends.Config) { c.NATS.AckWait = -1 }, wantErr: backends.ErrInvalidConfig},
		{name: "negative max ack pending", mutate: func(c *backends.Config) { c.NATS.MaxAckPending = -1 }, wantErr: backends.ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid
			tc.mutate(&cfg)
			err := cfg.Validate()
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
			require.ErrorIs(t, err, backends.ErrInvalidConfig, "every problem is an invalid config")
		})
	}
}

// TestConfigValidateEveryProblem: Validate reports all problems at once, in
// its documented order, each matching ErrInvalidConfig beside its own
// sentinel.
func TestConfigValidateEveryProblem(t *testing.T) {
	cfg := backends.Config{URL: "kafka://localhost:9092", DialTimeout: -1, NATS: backends.NATSConfig{AckWait: -2, MaxAckPending: -3}}
	cfg.Kafka.Version = "latest"
	cfg.AMQP.PublishGroups = []string{" "}
	err := cfg.Validate()
	require.Error(t, err)
	problems := err.(interface{ Unwrap() []error }).Unwrap()
	require.Len(t, problems, 6, err.Error())
	for _, p := range problems {
		assert.ErrorIs(t, p, backends.ErrInvalidConfig, p.Error())
	}
	assert.ErrorIs(t, problems[0], backends.ErrMissingGroup)
	assert.Equal(t, "backends: missing consumer group: kafka needs one (set BROKER_GROUP)", problems[0].Error())
	assert.Equal(t, "backends: invalid config: DialTimeout is negative (-1ns)", problems[1].Error())
	assert.Equal(t, "backends: invalid config: NATS.AckWait is negative (-2ns)", problems[2].Error())
	assert.Equal(t, "backends: invalid config: NATS.MaxAckPending is negative (-3)", problems[3].Error())
	assert.Contains(t, problems[4].Error(), `backends: invalid config: Kafka.Version "latest"`)
	assert.Equal(t, "backends: invalid config: AMQP.PublishGroups holds an empty group", problems[5].Error())

	// A URL that names no broker hides the Group problem (whether a group is
	// needed depends on the broker) but not the others.
	cfg.URL = "sqs://queue"
	err = cfg.Validate()
	assert.ErrorIs(t, err, backends.ErrUnknownBroker)
	assert.NotErrorIs(t, err, backends.ErrMissingGroup)
	problems = err.(interface{ Unwrap() []error }).Unwrap()
	require.Len(t, problems, 6, err.Error())
	assert.ErrorIs(t, problems[0], backends.ErrUnknownBroker)
	assert.ErrorIs(t, problems[0], backends.ErrInvalidConfig)
}

func TestFromEnv(t *testing.T) {
	t.Setenv(backends.EnvURL, " redis://localhost:6379/0 ")
	t.Setenv(backends.EnvGroup, "billing")
	t.Setenv(backends.EnvConsumer, "billing-7f9c")
	t.Setenv(backends.EnvNackResendSleep, "250ms")
	t.Setenv(backends.EnvDialTimeout, "3s")
	t.Setenv(backends.EnvKafkaPartitions, "12")
	t.Setenv(backends.EnvKafkaReplicationFactor, "3")
	t.Setenv(backends.EnvKafkaVersion, "3.6.0")
	t.Setenv(backends.EnvRedisMaxIdleTime, "90s")
	t.Setenv(backends.EnvRedisClaimInterval, "10s")
	t.Setenv(backends.EnvRedisMaxLen, "100000")
	t.Setenv(backends.EnvAMQPPrefetch, "8")
	t.Setenv(backends.EnvAMQPPublishGroups, "billing, shipping,,")
	t.Setenv(backends.EnvNATSAckWait, "2m")
	t.Setenv(backends.EnvNATSMaxAckPending, "50")

	cfg, err := backends.FromEnv()
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	assert.Equal(t, backends.Config{
		URL:             "redis://localhost:6379/0",
		Group:           "billing",
		Consumer:        "billing-7f9c",
		NackResendSleep: 250 * time.Millisecond,
		DialTimeout:     3 * time.Second,
		Kafka:           backends.KafkaConfig{Partitions: 12, ReplicationFactor: 3, Version: "3.6.0"},
		Redis:           backends.RedisConfig{MaxIdleTime: 90 * time.Second, ClaimInterval: 10 * time.Second, MaxLen: 100000},
		AMQP:            backends.AMQPConfig{Prefetch: 8, PublishGroups: []string{"billing", "shipping"}},
		NATS:            backends.NATSConfig{AckWait: 2 * time.Minute, MaxAckPending: 50},
	}, cfg)
}

func TestFromEnv_UnsetIsZero(t *testing.T) {
	for _, name := range allEnvVars {
		t.Setenv(name, "")
	}
	t.Setenv(backends.EnvURL, "gochannel://")
	cfg, err := backends.FromEnv()
	require.NoError(t, err)
	assert.Equal(t, backends.Config{URL: "gochannel://"}, cfg)
	require.NoError(t, cfg.Validate())
}

func TestFromEnv_Malformed(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{backends.EnvNackResendSleep, "1"},
		{backends.EnvDialTimeout, "soon"},
		{backends.EnvKafkaPartitions, "three"},
		{backends.EnvKafkaPartitions, "4294967296"},
		{backends.EnvKafkaReplicationFactor, "70000"},
		{backends.EnvRedisMaxIdleTime, "60"},
		{backends.EnvRedisMaxLen, "1e6"},
		{backends.EnvAMQPPrefetch, "x"},
		{backends.EnvNATSAckWait, "forever"},
		{backends.EnvNATSMaxAckPending, "-"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			for _, name := range allEnvVars {
				t.Setenv(name, "")
			}
			t.Setenv(backends.EnvURL, "kafka://localhost:9092")
			t.Setenv(tc.name, tc.value)
			_, err := backends.FromEnv()
			require.ErrorIs(t, err, backends.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.name)
		})
	}
}

var allEnvVars = []string{
	backends.EnvURL, backends.EnvGroup, backends.EnvConsumer, backends.EnvNackResendSleep, backends.EnvDialTimeout,
	backends.EnvKafkaPartitions, backends.EnvKafkaReplicationFactor, backends.EnvKafkaVersion,
	backends.EnvRedisMaxIdleTime, backends.EnvRedisClaimInterval, backends.EnvRedisMaxLen,
	backends.EnvAMQPPrefetch, backends.EnvAMQPPublishGroups, backends.EnvNATSAckWait, backends.EnvNATSMaxAckPending,
}

func TestNew_BadConfig(t *testing.T) {
	_, err := backends.New(backends.Config{URL: "mqtt://broker:1883", Group: "g"}, nil)
	require.ErrorIs(t, err, backends.ErrUnknownBroker)
	assert.Contains(t, err.Error(), "mqtt")

	_, err = backends.New(backends.Config{URL: "nats://localhost:4222"}, nil)
	require.ErrorIs(t, err, backends.ErrMissingGroup)
	assert.Contains(t, err.Error(), backends.EnvGroup)

	_, err = backends.New(backends.Config{URL: "kafka://localhost:x", Group: "g"}, nil)
	require.ErrorIs(t, err, backends.ErrInvalidURL)
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
	all := []error{backends.ErrUnknownBroker, backends.ErrBrokerNotLinked, backends.ErrInvalidURL, backends.ErrMissingGroup,
		backends.ErrInvalidConfig, backends.ErrUnreachable, backends.ErrDuplicatePublish, backends.ErrUnroutable}
	for i, a := range all {
		for j, b := range all {
			assert.Equal(t, i == j, errors.Is(a, b), "%v vs %v", a, b)
		}
	}
}

// A NATS password or token holding an unescaped '?', '#' or '/', or a bad
// percent escape, is refused by ParseURL, before New dials: nats.go parsed
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
		_, err := backends.ParseURL(raw)
		require.ErrorIs(t, err, backends.ErrInvalidURL, userinfo)
		assert.NotContains(t, err.Error(), "s3cr3t", userinfo)
		b, err := backends.New(backends.Config{URL: raw, Group: "g", DialTimeout: 5 * time.Second}, nil)
		if b != nil {
			_ = b.Close()
		}
		require.Error(t, err, userinfo)
		assert.NotContains(t, err.Error(), "s3cr3t", userinfo)
	}
	// Percent-encoded, the same characters are fine.
	_, err := backends.ParseURL("nats://user:s3cr3t%3Ftail%23%2F@" + hostPort)
	require.NoError(t, err)
}
