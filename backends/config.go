package backends

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// Broker names a message broker that New can build a Publisher and Subscriber
// for. It is taken from the scheme of Config.URL.
type Broker string

// The supported brokers, each with the URL schemes that select it.
const (
	// Kafka is selected by kafka://host:9092[,host2:9092].
	Kafka Broker = "kafka"
	// RedisStreams is selected by redis://[user:pass@]host:6379/0, or
	// rediss:// for TLS.
	RedisStreams Broker = "redis"
	// AMQP (RabbitMQ) is selected by amqp://user:pass@host:5672/vhost, or
	// amqps:// for TLS.
	AMQP Broker = "amqp"
	// NATS (JetStream) is selected by nats://host:4222[,host2:4222].
	NATS Broker = "nats"
	// GoChannel (in-process, for tests and demos) is selected by gochannel://.
	GoChannel Broker = "gochannel"
)

var brokerBySchema = map[string]Broker{
	"kafka":     Kafka,
	"redis":     RedisStreams,
	"rediss":    RedisStreams,
	"amqp":      AMQP,
	"amqps":     AMQP,
	"nats":      NATS,
	"gochannel": GoChannel,
}

// Defaults for the zero values of Config fields.
const (
	defaultDialTimeout        = 10 * time.Second
	defaultNackResendSleep    = time.Second
	defaultKafkaPartitions    = 12
	defaultKafkaMaxReplicas   = 3
	defaultRedisMaxIdleTime   = 60 * time.Second
	defaultRedisClaimInterval = 5 * time.Second
	defaultAMQPPrefetch       = 1
	defaultNATSAckWait        = 60 * time.Second
	defaultNATSMaxAckPending  = 100
)

// Config selects a broker and tells New how to use it. A service moves from
// one broker to another by changing URL (BROKER_URL) alone: every other field
// has a default that suits every broker, and the per-broker sections are read
// only by their own broker.
//
// Every zero field means its documented default; only URL is required, and
// Group for every broker but gochannel.
type Config struct {
	// URL names the broker by its scheme and says where it is:
	//
	//	kafka://host:9092[,host2:9092]
	//	redis://[user:pass@]host:6379/0   (rediss:// for TLS; go-redis URL options allowed)
	//	amqp://user:pass@host:5672/vhost  (amqps:// for TLS; amqp091 URI options allowed)
	//	nats://[user:pass@]host:4222[,host2:4222]
	//	gochannel://
	//
	// Empty is an error.
	URL string

	// Group is the consumer group. Subscribers that share a group divide the
	// messages of a topic between them (competing consumers); every group
	// receives every message (fan-out). It names the Kafka consumer group,
	// the Redis Streams consumer group, the AMQP queue (topic_group) and the
	// NATS JetStream durable consumer. Empty is an error for every broker
	// but gochannel, whose subscribers each receive every message.
	Group string

	// Consumer names this process within Group: the Redis Streams consumer
	// name, and the client name shown by Kafka, RabbitMQ and NATS. Keep it
	// stable across restarts and unique among the processes of a group.
	// Zero means the host name (the pod name on Kubernetes); set it when
	// several processes of one group share a host, or they share one Redis
	// Streams consumer and its pending messages.
	Consumer string

	// NackResendSleep is how long a nacked message waits before it is
	// delivered again, so that a failing handler, or a message whose key is
	// in progress elsewhere, does not spin. Zero means 1 s; negative is an
	// error. Kafka, Redis Streams, AMQP and gochannel wait in the
	// subscriber, holding back the messages behind the nacked one; NATS
	// asks the server to redeliver later (NakWithDelay) and moves on.
	NackResendSleep time.Duration

	// DialTimeout bounds how long New waits for the broker to answer before
	// it returns ErrUnreachable. Zero means 10 s; negative is an error.
	DialTimeout time.Duration

	// Kafka holds settings read only by the Kafka backend.
	Kafka KafkaConfig
	// Redis holds settings read only by the Redis Streams backend.
	Redis RedisConfig
	// AMQP holds settings read only by the AMQP backend.
	AMQP AMQPConfig
	// NATS holds settings read only by the NATS JetStream backend.
	NATS NATSConfig
}

// KafkaConfig holds the Kafka backend's settings.
type KafkaConfig struct {
	// Partitions is the partition count of the topics the backend creates
	// (it creates a topic before its first publish or subscribe; existing
	// topics are left as they are). Zero means 12; negative is an error.
	//
	// A partition is consumed one message at a time: a message that fails,
	// or waits for its key to be free, holds back the messages behind it in
	// its partition, and only those. With one partition it stalls the whole
	// topic. Partitions also bound a group's parallelism, one consumer per
	// partition. 12 lets a group grow to 12 consumers, splits evenly over 1,
	// 2, 3, 4, 6 or 12 of them (16 would leave 3 or 6 consumers unequal
	// shares), and confines a stuck message to a twelfth of the traffic; 12
	// partitions times the replication factor is little for a cluster.
	// Partitions can be added later but never removed, and adding them
	// moves keys to other partitions, so start with enough.
	Partitions int32

	// ReplicationFactor is the replication factor of the topics the backend
	// creates. Zero means 3, or the number of brokers in the cluster when it
	// has fewer; negative is an error.
	ReplicationFactor int16

	// Version is the lowest Kafka version the cluster runs, which decides
	// the protocol versions the client speaks, e.g. "3.6.0". Zero means
	// "2.1.0", the oldest protocol Kafka 4 still accepts.
	Version string

	// Tune, when set, is called last on each sarama.Config the backend
	// builds (one for the publisher, one for the subscriber and topic
	// administration): the place for SASL, TLS or timeouts. Nil means no
	// changes. It cannot be set from the environment.
	Tune func(*sarama.Config)
}

// RedisConfig holds the Redis Streams backend's settings.
type RedisConfig struct {
	// MaxIdleTime is how long a message may stay delivered but unacked
	// before another consumer of the group claims it (XCLAIM). Redis Streams
	// has no heartbeat: a consumer whose handler is still running loses the
	// message after MaxIdleTime as surely as a dead one does. Keep it above
	// the idempotency lease (40 s): a message claimed from a live consumer
	// then finds its key IN_PROGRESS and the middleware nacks it until the
	// first handler completes, and one claimed from a dead consumer finds
	// the lease already expired and runs at once. Zero means 60 s; negative
	// is an error.
	MaxIdleTime time.Duration

	// ClaimInterval is how often a subscriber looks for messages idle longer
	// than MaxIdleTime. Zero means 5 s; negative is an error.
	ClaimInterval time.Duration

	// MaxLen caps each stream at about this many entries (XADD MAXLEN ~).
	// Trimming drops the oldest entries whether or not every group has read
	// them. Zero means no cap; negative is an error.
	MaxLen int64
}

// AMQPConfig holds the AMQP backend's settings.
type AMQPConfig struct {
	// Prefetch is how many unacked messages RabbitMQ hands to each
	// subscription at once. Zero means 1; negative is an error.
	Prefetch int

	// PublishGroups lists the consumer groups whose durable queues the
	// publisher declares and binds before its first publish to a topic, so
	// that messages published before those groups first subscribe wait in
	// their queues instead of being dropped by the exchange. Zero means
	// Config.Group alone. A group listed here that never consumes collects
	// messages without bound: a publish-only service should list the groups
	// that consume its topics.
	PublishGroups []string
}

// NATSConfig holds the NATS JetStream backend's settings.
type NATSConfig struct {
	// AckWait is how long the server waits for an ack, or for a progress
	// ack, before it redelivers a message (the durable consumer's AckWait).
	// The subscriber sends progress acks every AckWait/3 while a handler
	// runs, so only a message whose consumer died, or that no handler took,
	// is redelivered. Keep it above the idempotency lease (40 s), so that a
	// dead consumer's key is free when its message comes back. Zero means
	// 60 s; negative is an error.
	AckWait time.Duration

	// MaxAckPending caps the messages delivered but not yet acked across
	// the whole group, per topic. Messages queued in a client beyond what it
	// can handle within AckWait are redelivered elsewhere, so keep it small.
	// Zero means 100; negative is an error.
	MaxAckPending int
}

// ParseURL returns a Config that selects the broker rawURL names, after
// checking the URL as Validate does. Group and the other fields are left
// zero.
func ParseURL(rawURL string) (Config, error) {
	if _, err := parseEndpoint(rawURL); err != nil {
		return Config{}, err
	}
	return Config{URL: rawURL}, nil
}

// The environment variables FromEnv reads, one per Config field.
const (
	EnvURL                    = "BROKER_URL"
	EnvGroup                  = "BROKER_GROUP"
	EnvConsumer               = "BROKER_CONSUMER"
	EnvNackResendSleep        = "BROKER_NACK_RESEND_SLEEP"
	EnvDialTimeout            = "BROKER_DIAL_TIMEOUT"
	EnvKafkaPartitions        = "BROKER_KAFKA_PARTITIONS"
	EnvKafkaReplicationFactor = "BROKER_KAFKA_REPLICATION_FACTOR"
	EnvKafkaVersion           = "BROKER_KAFKA_VERSION"
	EnvRedisMaxIdleTime       = "BROKER_REDIS_MAX_IDLE_TIME"
	EnvRedisClaimInterval     = "BROKER_REDIS_CLAIM_INTERVAL"
	EnvRedisMaxLen            = "BROKER_REDIS_MAXLEN"
	EnvAMQPPrefetch           = "BROKER_AMQP_PREFETCH"
	EnvAMQPPublishGroups      = "BROKER_AMQP_PUBLISH_GROUPS"
	EnvNATSAckWait            = "BROKER_NATS_ACK_WAIT"
	EnvNATSMaxAckPending      = "BROKER_NATS_MAX_ACK_PENDING"
)

// FromEnv returns the Config described by the environment: BROKER_URL,
// BROKER_GROUP and BROKER_CONSUMER as they are, durations in Go syntax
// (BROKER_NACK_RESEND_SLEEP=500ms), numbers in decimal, and
// BROKER_AMQP_PUBLISH_GROUPS comma-separated; see the Env constants for every
// name. An unset or empty variable leaves its field zero (its default). A
// variable that does not parse is an ErrInvalidConfig. FromEnv does not
// validate the result: New does.
func FromEnv() (Config, error) {
	return fromEnv(os.Getenv)
}

func fromEnv(getenv func(string) string) (Config, error) {
	p := envParser{getenv: getenv}
	c := Config{
		URL:             strings.TrimSpace(getenv(EnvURL)),
		Group:           strings.TrimSpace(getenv(EnvGroup)),
		Consumer:        strings.TrimSpace(getenv(EnvConsumer)),
		NackResendSleep: p.duration(EnvNackResendSleep),
		DialTimeout:     p.duration(EnvDialTimeout),
		Kafka: KafkaConfig{
			Partitions:        int32(p.int(EnvKafkaPartitions, 32)),
			ReplicationFactor: int16(p.int(EnvKafkaReplicationFactor, 16)),
			Version:           strings.TrimSpace(getenv(EnvKafkaVersion)),
		},
		Redis: RedisConfig{
			MaxIdleTime:   p.duration(EnvRedisMaxIdleTime),
			ClaimInterval: p.duration(EnvRedisClaimInterval),
			MaxLen:        p.int(EnvRedisMaxLen, 64),
		},
		AMQP: AMQPConfig{
			Prefetch:      int(p.int(EnvAMQPPrefetch, 32)),
			PublishGroups: splitList(getenv(EnvAMQPPublishGroups)),
		},
		NATS: NATSConfig{
			AckWait:       p.duration(EnvNATSAckWait),
			MaxAckPending: int(p.int(EnvNATSMaxAckPending, 32)),
		},
	}
	if p.err != nil {
		return Config{}, p.err
	}
	return c, nil
}

// envParser parses variables and keeps the first error.
type envParser struct {
	getenv func(string) string
	err    error
}

func (p *envParser) duration(name string) time.Duration {
	v := strings.TrimSpace(p.getenv(name))
	if v == "" || p.err != nil {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		p.err = fmt.Errorf("%w: %s=%q is not a duration such as 500ms or 2s", ErrInvalidConfig, name, v)
	}
	return d
}

func (p *envParser) int(name string, bits int) int64 {
	v := strings.TrimSpace(p.getenv(name))
	if v == "" || p.err != nil {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, bits)
	if err != nil {
		p.err = fmt.Errorf("%w: %s=%q is not a %d-bit integer", ErrInvalidConfig, name, v, bits)
	}
	return n
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Broker returns the broker that c.URL selects.
func (c Config) Broker() (Broker, error) {
	ep, err := parseEndpoint(c.URL)
	if err != nil {
		return "", err
	}
	return ep.broker, nil
}

// Validate reports whether c can be used by New: a URL that names a
// supported broker and parses for it, a Group where the broker needs one, and
// no negative durations or counts. Zero values are valid: they mean the
// documented defaults. Validate does not contact the broker.
func (c Config) Validate() error {
	ep, err := parseEndpoint(c.URL)
	if err != nil {
		return err
	}
	if ep.broker != GoChannel && strings.TrimSpace(c.Group) == "" {
		return fmt.Errorf("%w: %s needs one (set %s)", ErrMissingGroup, ep.broker, EnvGroup)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"NackResendSleep", c.NackResendSleep},
		{"DialTimeout", c.DialTimeout},
		{"Redis.MaxIdleTime", c.Redis.MaxIdleTime},
		{"Redis.ClaimInterval", c.Redis.ClaimInterval},
		{"NATS.AckWait", c.NATS.AckWait},
	} {
		if d.v < 0 {
			return fmt.Errorf("%w: %s is negative (%v)", ErrInvalidConfig, d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int64
	}{
		{"Kafka.Partitions", int64(c.Kafka.Partitions)},
		{"Kafka.ReplicationFactor", int64(c.Kafka.ReplicationFactor)},
		{"Redis.MaxLen", c.Redis.MaxLen},
		{"AMQP.Prefetch", int64(c.AMQP.Prefetch)},
		{"NATS.MaxAckPending", int64(c.NATS.MaxAckPending)},
	} {
		if n.v < 0 {
			return fmt.Errorf("%w: %s is negative (%d)", ErrInvalidConfig, n.name, n.v)
		}
	}
	if c.Kafka.Version != "" {
		if _, err := sarama.ParseKafkaVersion(c.Kafka.Version); err != nil {
			return fmt.Errorf("%w: Kafka.Version %q: %v", ErrInvalidConfig, c.Kafka.Version, err)
		}
	}
	for _, g := range c.AMQP.PublishGroups {
		if strings.TrimSpace(g) == "" {
			return fmt.Errorf("%w: AMQP.PublishGroups holds an empty group", ErrInvalidConfig)
		}
	}
	return nil
}

// withDefaults returns c with every zero field replaced by its default.
func (c Config) withDefaults() Config {
	c.URL = strings.TrimSpace(c.URL)
	c.Group = strings.TrimSpace(c.Group)
	if c.Consumer == "" {
		c.Consumer = defaultConsumerName()
	}
	if c.NackResendSleep == 0 {
		c.NackResendSleep = defaultNackResendSleep
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = defaultDialTimeout
	}
	if c.Kafka.Partitions == 0 {
		c.Kafka.Partitions = defaultKafkaPartitions
	}
	if c.Kafka.Version == "" {
		c.Kafka.Version = sarama.DefaultVersion.String()
	}
	if c.Redis.MaxIdleTime == 0 {
		c.Redis.MaxIdleTime = defaultRedisMaxIdleTime
	}
	if c.Redis.ClaimInterval == 0 {
		c.Redis.ClaimInterval = defaultRedisClaimInterval
	}
	if c.AMQP.Prefetch == 0 {
		c.AMQP.Prefetch = defaultAMQPPrefetch
	}
	if len(c.AMQP.PublishGroups) == 0 && c.Group != "" {
		c.AMQP.PublishGroups = []string{c.Group}
	} else {
		c.AMQP.PublishGroups = append([]string(nil), c.AMQP.PublishGroups...)
	}
	if c.NATS.AckWait == 0 {
		c.NATS.AckWait = defaultNATSAckWait
	}
	if c.NATS.MaxAckPending == 0 {
		c.NATS.MaxAckPending = defaultNATSMaxAckPending
	}
	return c
}

func defaultConsumerName() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	// Without a host name there is nothing stable to use; a fixed name at
	// least keeps a restarted process from leaving a dead consumer behind.
	return "watermill"
}

// endpoint is a parsed Config.URL.
type endpoint struct {
	broker Broker
	// url is the URL handed to the broker's client library.
	url string
	// addrs are the host:port pairs the client dials, for reachability
	// checks and error messages.
	addrs []string
}

func parseEndpoint(raw string) (endpoint, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return endpoint{}, fmt.Errorf("%w: empty (set %s, e.g. kafka://localhost:9092)", ErrInvalidURL, EnvURL)
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return endpoint{}, fmt.Errorf("%w: %q has no scheme://", ErrInvalidURL, redact(raw))
	}
	broker, ok := brokerBySchema[strings.ToLower(scheme)]
	if !ok {
		return endpoint{}, fmt.Errorf("%w: scheme %q in %q (want kafka, redis, rediss, amqp, amqps, nats or gochannel)",
			ErrUnknownBroker, scheme, redact(raw))
	}
	switch broker {
	case Kafka:
		return parseHostList(Kafka, raw, "9092")
	case RedisStreams:
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return endpoint{}, fmt.Errorf("%w: %q: %s", ErrInvalidURL, redact(raw), scrub(raw, err))
		}
		return endpoint{broker: RedisStreams, url: raw, addrs: []string{opts.Addr}}, nil
	case AMQP:
		uri, err := amqp091.ParseURI(raw)
		if err != nil {
			return endpoint{}, fmt.Errorf("%w: %q: %s", ErrInvalidURL, redact(raw), scrub(raw, err))
		}
		return endpoint{broker: AMQP, url: raw, addrs: []string{net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))}}, nil
	case NATS:
		return parseHostList(NATS, raw, "4222")
	default:
		u, err := url.Parse(raw)
		if err != nil {
			return endpoint{}, fmt.Errorf("%w: %q: %v", ErrInvalidURL, raw, err)
		}
		if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return endpoint{}, fmt.Errorf("%w: %q: gochannel takes nothing after gochannel://", ErrInvalidURL, raw)
		}
		return endpoint{broker: GoChannel, url: raw}, nil
	}
}

// parseHostList parses scheme://[user:pass@]host[:port][,host[:port]...], the
// form Kafka and NATS take, filling defPort where a host has none. It splits
// by hand: net/url rejects a host list whose last host has no port.
func parseHostList(b Broker, raw, defPort string) (endpoint, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if tail != "" && tail != "/" {
		return endpoint{}, fmt.Errorf("%w: %q: %s takes only host:port pairs, not %q", ErrInvalidURL, redact(raw), b, tail)
	}
	var userinfo string
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, authority = authority[:i], authority[i+1:]
		if b == Kafka {
			return endpoint{}, fmt.Errorf("%w: %q: put Kafka credentials in KafkaConfig.Tune (SASL), not in the URL", ErrInvalidURL, redact(raw))
		}
	}
	var addrs, urls []string
	for _, h := range strings.Split(authority, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return endpoint{}, fmt.Errorf("%w: %q: empty host", ErrInvalidURL, redact(raw))
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port, or a bare IPv6 address in brackets.
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defPort
		}
		if host == "" || strings.ContainsAny(host, " []@:") && !strings.Contains(h, "[") {
			return endpoint{}, fmt.Errorf("%w: %q: bad host %q", ErrInvalidURL, redact(raw), h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return endpoint{}, fmt.Errorf("%w: %q: bad port %q", ErrInvalidURL, redact(raw), port)
		}
		addr := net.JoinHostPort(host, port)
		addrs = append(addrs, addr)
		u := strings.ToLower(scheme) + "://"
		if userinfo != "" {
			u += userinfo + "@"
		}
		urls = append(urls, u+addr)
	}
	// nats.Connect takes a comma-separated list of full URLs.
	return endpoint{broker: b, url: strings.Join(urls, ","), addrs: addrs}, nil
}

// scrub returns err's text with the password of raw, which client libraries
// quote in their parse errors, hidden.
func scrub(raw string, err error) string {
	if r := redact(raw); r != raw {
		return strings.ReplaceAll(err.Error(), raw, r)
	}
	return err.Error()
}

// redact hides a password in a URL meant for an error message.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return raw
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
