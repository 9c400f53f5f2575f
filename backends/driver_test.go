package backends_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/backends"
)

// A URL of a broker that the program does not link is refused by ParseURL,
// Validate and New alike, with the import to add. This package's tests
// link every broker, so the refusal is tested where one is missing: in the
// tests of each broker package, which link that broker alone
// (TestBrokersNotLinked there). Here every broker is linked, and
// registering one twice, or one this package does not know, panics.
func TestRegister(t *testing.T) {
	assert.Equal(t, []backends.Broker{backends.AMQP, backends.GoChannel, backends.Kafka, backends.NATS, backends.RedisStreams},
		backends.Linked())
	open := func(backends.Config, backends.Endpoint, watermill.LoggerAdapter) (backends.Clients, error) {
		return backends.Clients{}, nil
	}
	parse := func(string) (backends.Endpoint, error) { return backends.Endpoint{}, nil }
	assert.PanicsWithValue(t, `backends: Register called twice for broker "kafka"`, func() {
		backends.Register(backends.Driver{Broker: backends.Kafka, ParseURL: parse, Open: open})
	})
	assert.PanicsWithValue(t, `backends: Register of unknown broker "pulsar"`, func() {
		backends.Register(backends.Driver{Broker: "pulsar", ParseURL: parse, Open: open})
	})
	assert.PanicsWithValue(t, `backends: Register of unknown broker "gochannel"`, func() {
		backends.Register(backends.Driver{Broker: backends.GoChannel, ParseURL: parse, Open: open})
	})
	assert.Panics(t, func() { backends.Register(backends.Driver{Broker: backends.NATS}) })
}
