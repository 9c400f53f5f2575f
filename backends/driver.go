package backends

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// A Driver opens one broker for New. Each broker package of this module
// registers its Driver with Register from an init function, so that a
// program links the client libraries of the brokers it imports and no
// others:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
//
// Only those packages need Driver; a program never calls it.
type Driver struct {
	// Broker is the broker the driver opens: Kafka, RedisStreams, AMQP or
	// NATS (GoChannel is built in).
	Broker Broker

	// ParseURL checks raw, a URL whose scheme selects Broker, and returns
	// the URL to give the client library and the addresses New dials (it
	// leaves Endpoint.Broker to New). The text of its error must quote
	// nothing of raw: New wraps it as an ErrInvalidURL that names the URL
	// by its scheme and host alone.
	ParseURL func(raw string) (Endpoint, error)

	// Open builds the Publisher and the Subscriber of Config.Group of the
	// broker at ep. cfg has its defaults filled and passed Validate, and
	// one of ep.Addrs accepted a connection. On error Open leaves nothing
	// open.
	Open func(cfg Config, ep Endpoint, logger watermill.LoggerAdapter) (Clients, error)
}

// Endpoint is a broker URL as its Driver parsed it.
type Endpoint struct {
	// Broker is the broker the URL selects.
	Broker Broker
	// URL is what the client library is given: for Kafka and NATS one URL
	// per host, joined with ','.
	URL string
	// Addrs are the host:port pairs the client dials; New checks that one
	// of them accepts a connection before it calls Open, and errors name
	// them. gochannel has none.
	Addrs []string
}

// Unreachable returns an ErrUnreachable that names e's broker and
// addresses, with err, a client library's error, scrubbed of e.URL's user
// information: a library that parses the URL again (nats.go does, per
// server) may quote it. within is how long the client tried.
func (e Endpoint) Unreachable(within time.Duration, err error) error {
	return fmt.Errorf("%w: %s at %s (within %v): %s", ErrUnreachable, e.Broker, strings.Join(e.Addrs, ","), within,
		scrubUserinfo(err.Error(), e.URL))
}

// Refused returns an ErrInvalidConfig that names e's broker and addresses,
// for err, the broker's answer that it will not take the Config: wrong
// credentials, or a database or virtual host it does not have. Unlike an
// ErrUnreachable, the same Config fails again. err is scrubbed of e.URL's
// user information, as in Unreachable. A Driver returns it only for an
// answer it can tell from a timeout or a dropped connection.
func (e Endpoint) Refused(err error) error {
	return fmt.Errorf("%w: %s at %s refused the connection: %s", ErrInvalidConfig, e.Broker, strings.Join(e.Addrs, ","),
		scrubUserinfo(err.Error(), e.URL))
}

// Clients are what a Driver's Open builds, and what New returns as a
// Backend.
type Clients struct {
	// Publisher publishes to the broker.
	Publisher message.Publisher
	// Subscriber consumes as Config.Group.
	Subscriber message.Subscriber
	// NewSubscriber builds another Subscriber of the broker, with the same
	// settings, that consumes as group (Backend.SubscriberForGroup).
	NewSubscriber func(group string) (message.Subscriber, error)
}

// importPath is the package that registers each broker's Driver.
var importPath = map[Broker]string{
	Kafka:        "github.com/idempotency/watermill-idempotency/backends/kafkabackend",
	RedisStreams: "github.com/idempotency/watermill-idempotency/backends/redisbackend",
	AMQP:         "github.com/idempotency/watermill-idempotency/backends/amqpbackend",
	NATS:         "github.com/idempotency/watermill-idempotency/backends/natsbackend",
}

var (
	driversMu sync.RWMutex
	drivers   = map[Broker]Driver{GoChannel: goChannelDriver}
)

// Register makes d's broker available to New, ParseURL and Validate. The
// broker packages call it from init; as database/sql's Register does, it
// panics when d.Broker is not one of Kafka, RedisStreams, AMQP and NATS, is
// registered already, or d lacks ParseURL or Open: a mistake of the
// program's build, which no configuration can correct.
func Register(d Driver) {
	if _, ok := importPath[d.Broker]; !ok {
		panic(fmt.Sprintf("backends: Register of unknown broker %q", d.Broker))
	}
	if d.ParseURL == nil || d.Open == nil {
		panic(fmt.Sprintf("backends: Register of broker %q without ParseURL or Open", d.Broker))
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if _, dup := drivers[d.Broker]; dup {
		panic(fmt.Sprintf("backends: Register called twice for broker %q", d.Broker))
	}
	drivers[d.Broker] = d
}

// Linked returns the brokers this program can use, sorted: gochannel and
// those whose packages it imports.
func Linked() []Broker {
	driversMu.RLock()
	defer driversMu.RUnlock()
	var linked []Broker
	for b := range drivers {
		linked = append(linked, b)
	}
	slices.Sort(linked)
	return linked
}

// driverFor returns b's Driver, or an ErrBrokerNotLinked that names the
// package to import.
func driverFor(b Broker) (Driver, error) {
	driversMu.RLock()
	d, ok := drivers[b]
	driversMu.RUnlock()
	if !ok {
		return Driver{}, notLinkedError{broker: b, linked: Linked()}
	}
	return d, nil
}

// notLinkedError is an ErrBrokerNotLinked for one broker.
type notLinkedError struct {
	broker Broker
	linked []Broker
}

func (e notLinkedError) Error() string {
	return fmt.Sprintf("backends: broker %q is not linked: import _ %q (this program links %s)",
		e.broker, importPath[e.broker], brokerNames(e.linked))
}

// brokerNames lists brokers for an error message: "gochannel, redis".
func brokerNames(brokers []Broker) string {
	names := make([]string, len(brokers))
	for i, b := range brokers {
		names[i] = string(b)
	}
	return strings.Join(names, ", ")
}

func (e notLinkedError) Unwrap() error { return ErrBrokerNotLinked }
