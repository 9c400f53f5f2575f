package brokerkit

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The sentinels of package backends, which declares them again as its own
// variables: the broker packages return them without an import cycle.
var (
	ErrInvalidConfig    = errors.New("backends: invalid config")
	ErrUnreachable      = errors.New("backends: broker unreachable")
	ErrDuplicatePublish = errors.New("backends: publish dropped by the broker as a duplicate")
	ErrUnroutable       = errors.New("backends: publish unroutable: no queue bound to the topic")
)

// MetadataUndecodable is backends.MetadataUndecodable.
const MetadataUndecodable = "_backends_undecodable"

// Broker names a broker; a URL's scheme selects it.
type Broker string

// The brokers. Every one but GoChannel lives in a package of its own.
const (
	Kafka        Broker = "kafka"
	RedisStreams Broker = "redis"
	AMQP         Broker = "amqp"
	NATS         Broker = "nats"
	GoChannel    Broker = "gochannel"
)

// Settings are the fields of backends.Config that every broker reads, with
// their defaults filled and validated.
type Settings struct {
	Group, Consumer string
	NackResendSleep time.Duration
	DialTimeout     time.Duration
	// Tune, when not nil, is called last on each client configuration.
	Tune func(clientConfig any)
}

// TuneClient calls s.Tune on c, when set.
func (s Settings) TuneClient(c any) {
	if s.Tune != nil {
		s.Tune(c)
	}
}

// A Driver opens one broker for backends.New.
type Driver struct {
	Broker Broker
	// ParseURL checks raw, whose scheme selects Broker, and reads the
	// backend's parameters from its query. Its error must quote nothing
	// of raw: backends names the URL by its scheme and host alone.
	ParseURL func(raw string) (Endpoint, error)
	// Open builds the Publisher and the Subscriber of s.Group. One of
	// ep.Addrs accepted a connection. On error it leaves nothing open.
	Open func(s Settings, ep Endpoint, logger watermill.LoggerAdapter) (Clients, error)
}

// Endpoint is a broker URL as its Driver parsed it.
type Endpoint struct {
	Broker Broker
	// URL is what the client library is given, without the backend's
	// parameters: for Kafka and NATS one URL per host, joined with ','.
	URL string
	// Addrs are the host:port pairs that New dials first.
	Addrs []string
	// Options are the Driver's parameters, read from the URL's query.
	Options any
	// Redelivery is how long the broker lets a message stay unacked before
	// it hands it to another consumer, and RedeliveryParam the URL
	// parameter that sets it; zero for brokers without such a timer.
	Redelivery      time.Duration
	RedeliveryParam string
}

// Unreachable returns an ErrUnreachable that names e's broker and
// addresses, with err scrubbed of e.URL's user information.
func (e Endpoint) Unreachable(within time.Duration, err error) error {
	return fmt.Errorf("%w: %s at %s (within %v): %s", ErrUnreachable, e.Broker, strings.Join(e.Addrs, ","), within,
		ScrubUserinfo(err.Error(), e.URL))
}

// Refused returns an ErrInvalidConfig for err, the broker's answer that it
// will not take the URL (credentials, a database or virtual host), scrubbed
// as in Unreachable. Unlike ErrUnreachable, a retry fails again.
func (e Endpoint) Refused(err error) error {
	return fmt.Errorf("%w: %s at %s refused the connection: %s", ErrInvalidConfig, e.Broker, strings.Join(e.Addrs, ","),
		ScrubUserinfo(err.Error(), e.URL))
}

// Clients are what a Driver's Open builds.
type Clients struct {
	Publisher  message.Publisher
	Subscriber message.Subscriber
	// NewSubscriber builds another Subscriber, of group.
	NewSubscriber func(group string) (message.Subscriber, error)
}

var (
	driversMu sync.RWMutex
	drivers   = map[Broker]Driver{}
)

// Register makes d available to package backends. The broker packages call
// it from init; a second registration of a broker panics.
func Register(d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if _, dup := drivers[d.Broker]; dup {
		panic(fmt.Sprintf("backends: Register called twice for broker %q", d.Broker))
	}
	drivers[d.Broker] = d
}

// Lookup returns b's Driver.
func Lookup(b Broker) (Driver, bool) {
	driversMu.RLock()
	defer driversMu.RUnlock()
	d, ok := drivers[b]
	return d, ok
}

// Linked returns the names of the registered brokers, sorted.
func Linked() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	var names []string
	for b := range drivers {
		names = append(names, string(b))
	}
	slices.Sort(names)
	return names
}

// ScrubUserinfo replaces in text every occurrence of the user information
// of the URL (or URLs, comma-separated) raw, whole and split at ':', as
// written and percent-decoded, with "xxxxx".
func ScrubUserinfo(text, raw string) string {
	var secrets []string
	for _, u := range strings.Split(raw, ",") {
		_, rest, ok := strings.Cut(u, "://")
		at := strings.LastIndex(rest, "@")
		if !ok || at < 0 {
			continue
		}
		userinfo := rest[:at]
		parts := append([]string{userinfo}, strings.Split(userinfo, ":")...)
		for _, p := range parts {
			secrets = append(secrets, p)
			if d, err := url.PathUnescape(p); err == nil {
				secrets = append(secrets, d)
			}
		}
	}
	// Longest first, so that a part does not break up its whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			text = strings.ReplaceAll(text, s, "xxxxx")
		}
	}
	return text
}
