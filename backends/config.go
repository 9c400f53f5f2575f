package backends

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// Config selects a broker and tells [New] how to use it. A zero field means
// its default. Only URL is required, and Group on every broker but
// gochannel.
type Config struct {
	// URL names the broker by its scheme and says where it is. Its query
	// may hold the broker's parameters (see the package documentation);
	// the client library's own URL options pass through.
	URL string
	// Group is the consumer group. Subscribers of one group share a
	// topic's messages; each group gets every message.
	Group string
	// Consumer names this process within Group. Keep it stable across
	// restarts and unique in the group. The default is the host name.
	Consumer string
	// NackResendSleep is how long a nacked message waits before it comes
	// again. The default is 1 s.
	NackResendSleep time.Duration
	// DialTimeout bounds how long New waits for the broker. The default is
	// 10 s.
	DialTimeout time.Duration
	// Tune, when set, is called last on each client configuration the
	// backend builds: a *sarama.Config (Kafka), *redis.Options (Redis
	// Streams), *amqp091.Config (AMQP) or *nats.Options (NATS). It is the
	// place for SASL, TLS certificates and credentials files.
	Tune func(clientConfig any)
}

const (
	defaultDialTimeout     = 10 * time.Second
	defaultNackResendSleep = time.Second
)

// Validate reports every problem that keeps [New] from using c, joined. Each
// matches [ErrInvalidConfig]. Validate does not contact the broker.
func (c Config) Validate() error {
	l := configerr.New(ErrInvalidConfig)
	broker, err := brokerOf(c.URL)
	if err == nil {
		_, err = parseEndpoint(c.URL)
	}
	if err != nil {
		l.Add(err)
	}
	// A broker that is known, linked or not, still says whether it needs a
	// group, so that one run names both fixes.
	if broker != "" && broker != brokerkit.GoChannel && strings.TrimSpace(c.Group) == "" {
		l.Addf("missing consumer group: %s needs one (set %s)", broker, envGroup)
	}
	if c.NackResendSleep < 0 {
		l.Addf("NackResendSleep is negative (%v)", c.NackResendSleep)
	}
	if c.DialTimeout < 0 {
		l.Addf("DialTimeout is negative (%v)", c.DialTimeout)
	}
	return l.Err()
}

// settings returns c's common fields with their defaults filled.
func (c Config) settings() brokerkit.Settings {
	s := brokerkit.Settings{
		Group:           strings.TrimSpace(c.Group),
		Consumer:        c.Consumer,
		NackResendSleep: c.NackResendSleep,
		DialTimeout:     c.DialTimeout,
		Tune:            c.Tune,
	}
	if s.Consumer == "" {
		s.Consumer = defaultConsumerName()
	}
	if s.NackResendSleep == 0 {
		s.NackResendSleep = defaultNackResendSleep
	}
	if s.DialTimeout == 0 {
		s.DialTimeout = defaultDialTimeout
	}
	return s
}

func defaultConsumerName() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	// Without a host name there is nothing stable to use; a fixed name at
	// least keeps a restarted process from leaving a dead consumer behind.
	return "watermill"
}

const (
	envURL             = "BROKER_URL"
	envGroup           = "BROKER_GROUP"
	envConsumer        = "BROKER_CONSUMER"
	envNackResendSleep = "BROKER_NACK_RESEND_SLEEP"
	envDialTimeout     = "BROKER_DIAL_TIMEOUT"
)

// FromEnv returns the Config that these environment variables describe:
//
//	BROKER_URL                Config.URL, e.g. redis://localhost:6379/0?max_idle_time=90s
//	BROKER_GROUP              Config.Group
//	BROKER_CONSUMER           Config.Consumer
//	BROKER_NACK_RESEND_SLEEP  Config.NackResendSleep, e.g. 500ms
//	BROKER_DIAL_TIMEOUT       Config.DialTimeout, e.g. 5s
//
// An unset variable leaves its field zero, its default. A duration that does
// not parse is an [ErrInvalidConfig]. [New] validates the rest.
func FromEnv() (Config, error) {
	c := Config{
		URL:      strings.TrimSpace(os.Getenv(envURL)),
		Group:    strings.TrimSpace(os.Getenv(envGroup)),
		Consumer: strings.TrimSpace(os.Getenv(envConsumer)),
	}
	for _, d := range []struct {
		name  string
		field *time.Duration
	}{{envNackResendSleep, &c.NackResendSleep}, {envDialTimeout, &c.DialTimeout}} {
		v := strings.TrimSpace(os.Getenv(d.name))
		if v == "" {
			continue
		}
		n, err := time.ParseDuration(v)
		if err != nil {
			return Config{}, fmt.Errorf("%w: %s=%q is not a duration such as 500ms or 2s", ErrInvalidConfig, d.name, v)
		}
		*d.field = n
	}
	return c, nil
}
