package backends

import "errors"

// Errors returned by ParseURL, FromEnv, Config.Validate, New and the
// Publishers New builds. They are wrapped with the offending value; check
// them with errors.Is.
var (
	// ErrUnknownBroker is returned for a URL whose scheme names no supported
	// broker.
	ErrUnknownBroker = errors.New("backends: unknown broker")
	// ErrBrokerNotLinked is returned for a URL that names a supported broker
	// whose package the program does not import (Kafka, Redis Streams, AMQP
	// and NATS each live in a package of their own, so that a program links
	// only the client libraries it uses). The message names the import to
	// add, e.g. import _ "github.com/idempotency/watermill-idempotency/backends/kafkabackend".
	ErrBrokerNotLinked = errors.New("backends: broker not linked")
	// ErrInvalidURL is returned for a broker URL that cannot be parsed,
	// lacks a part its broker needs (a host), or has a port outside 1 to
	// 65535 (no port means the broker's default).
	ErrInvalidURL = errors.New("backends: invalid broker URL")
	// ErrMissingGroup is returned when Config.Group is empty for a broker
	// that delivers through consumer groups (every broker but gochannel).
	ErrMissingGroup = errors.New("backends: missing consumer group")
	// ErrInvalidConfig is returned for a Config field out of range, or an
	// environment variable that does not parse; every problem that
	// Config.Validate reports matches it, beside its own sentinel if it has
	// one. New returns it too when the broker answers and refuses the
	// connection: a wrong user name, password or token, a Redis database or
	// RabbitMQ virtual host it does not have. Retrying the same Config
	// fails again.
	ErrInvalidConfig = errors.New("backends: invalid config")
	// ErrUnreachable is returned by New when the broker does not answer
	// within Config.DialTimeout, or gives an answer that may change (Redis
	// still loading its data, or at its client limit; RabbitMQ at a
	// connection limit); the message names the
	// address tried. It is about the broker, not the Config: the same Config
	// may succeed once the broker is up.
	ErrUnreachable = errors.New("backends: broker unreachable")
	// ErrDuplicatePublish is returned by the NATS Publisher (package
	// natsbackend) for a message that JetStream did not store because the
	// stream already holds one with the same Nats-Msg-Id within its
	// duplicate window. The backend sends no Nats-Msg-Id of its own; a
	// message whose metadata sets one asks for this. It is declared here,
	// not in natsbackend, so that code handling a Publish error checks it
	// without linking a broker.
	ErrDuplicatePublish = errors.New("backends: publish dropped by the broker as a duplicate")
	// ErrUnroutable is returned by the AMQP Publisher (package amqpbackend)
	// for a message that RabbitMQ confirmed but could not route to any
	// queue (it returned the message): no group's queue is bound to the
	// topic's exchange, because no group has subscribed to the topic yet
	// and none is listed in AMQPConfig.PublishGroups, or because the queue
	// was deleted. Declared here for the same reason as ErrDuplicatePublish.
	ErrUnroutable = errors.New("backends: publish unroutable: no queue bound to the topic")
)
