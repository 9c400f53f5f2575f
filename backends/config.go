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
// its default. URL is required, and Group on every broker but gochannel.
type Config struct {
	// URL names the broker by its scheme; its query holds the parameters.
	URL string
	// Group is the consumer group: its subscribers share a topic's messages.
	Group string
	// Consumer names this process in Group, stable. The default is the host name.
	Consumer string
	// NackResendSleep is how long a nacked message waits before it comes
	// again. The default is 1 s.
	NackResendSleep time.Duration
	// DialTimeout bounds how long New waits for the broker. The default is 10 s.
	DialTimeout time.Duration
	// Tune is called last on each client configuration (*sarama.Config,
	// *redis.Options, *amqp091.Config, *nats.Options): set SASL, TLS there.
	Tune func(clientConfig any)
}

const (
	defaultDialTimeout     = 10 * time.Second
	defaultNackResendSleep = time.Second
)

// Validate reports every problem that keeps [New] from using c, joined,
// each an [ErrInvalidConfig]. It does not contact the broker.
func (c Config) Validate() error {
	l := configerr.New(ErrInvalidConfig)
	broker, err := brokerOf(c.URL)
	if err == nil {
		_, err = parseEndpoint(c.URL)
	}
	if err != nil {
		l.Add(err)
	}
	// A known broker, linked or not, still says it needs a group.
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

// settings returns c's common fields with the defaults filled in.
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
	// No host name: a fixed name still leaves no dead consumer at restarts.
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
// An unset variable is the default. A bad duration is an [ErrInvalidConfig].
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
