package backends

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/commalist"
)

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
			PublishGroups: commalist.Split(getenv(EnvAMQPPublishGroups)),
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
