package backends

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// Defaults for the zero values of Config fields.
const (
	defaultDialTimeout        = 10 * time.Second
	defaultNackResendSleep    = time.Second
	defaultKafkaPartitions    = 12
	defaultKafkaVersion       = "2.1.0"
	defaultRedisMaxIdleTime   = 60 * time.Second
	defaultRedisClaimInterval = 5 * time.Second
	defaultAMQPPrefetch       = 1
	defaultNATSAckWait        = 60 * time.Second
	defaultNATSMaxAckPending  = 100
)

// Validate reports every problem that keeps New from using c, not only the
// first: errors.Join of one error per problem, each matching
// ErrInvalidConfig, in this fixed order: URL (it must name a supported
// broker whose package the program imports, and parse for it; such a
// problem matches ErrUnknownBroker, ErrBrokerNotLinked or ErrInvalidURL as
// well); Group, where the URL's broker needs one (a problem that matches
// ErrMissingGroup as well; reported for a broker that is not linked too); NackResendSleep,
// DialTimeout, Redis.MaxIdleTime, Redis.ClaimInterval, NATS.AckWait (none
// negative); Kafka.Partitions, Kafka.ReplicationFactor, Redis.MaxLen,
// AMQP.Prefetch, NATS.MaxAckPending (none negative); Kafka.Version (a
// version as sarama reads it: 3.6.0, or 0.11.0.2 before Kafka 1);
// AMQP.PublishGroups (no empty group). Zero values
// are valid: they mean the documented defaults. Validate does not contact
// the broker.
func (c Config) Validate() error {
	l := configerr.New(ErrInvalidConfig)
	broker, err := brokerOf(c.URL)
	if err == nil {
		_, err = parseEndpoint(c.URL)
	}
	if err != nil {
		l.Add(err)
	}
	// A broker that is known but not linked still says whether it needs a
	// group, so that one run names both fixes.
	if broker != "" && (err == nil || errors.Is(err, ErrBrokerNotLinked)) &&
		broker != GoChannel && strings.TrimSpace(c.Group) == "" {
		l.Add(fmt.Errorf("%w: %s needs one (set %s)", ErrMissingGroup, broker, EnvGroup))
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
			l.Addf("%s is negative (%v)", d.name, d.v)
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
			l.Addf("%s is negative (%d)", n.name, n.v)
		}
	}
	if c.Kafka.Version != "" && !kafkaVersion.MatchString(c.Kafka.Version) {
		l.Addf("Kafka.Version %q is not a version such as 3.6.0", c.Kafka.Version)
	}
	if slices.ContainsFunc(c.AMQP.PublishGroups, func(g string) bool { return strings.TrimSpace(g) == "" }) {
		l.Addf("AMQP.PublishGroups holds an empty group")
	}
	return l.Err()
}

// kafkaVersion is the form sarama.ParseKafkaVersion reads: major.minor.patch
// since Kafka 1, 0.major.minor.patch before. The Kafka backend parses the
// version with sarama again; checking the form here keeps Validate's answer
// the same whether or not the program links Kafka.
var kafkaVersion = regexp.MustCompile(`^(0\.\d+\.\d+\.\d+|[1-9]\d*\.\d+\.\d+)$`)

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
		c.Kafka.Version = defaultKafkaVersion
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
	c.AMQP.PublishGroups = append([]string(nil), c.AMQP.PublishGroups...)
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
