package backends

import (
	"fmt"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// CheckLease checks the owner protocol's lease (once's LeaseTTL) against the
// broker's redelivery timer. The lease must
// be below ack_wait on NATS and below max_idle_time on Redis Streams. Kafka,
// AMQP and gochannel have no such timer and always pass.
//
// A longer lease loses nothing, but redeliveries spin. On NATS, a dead
// consumer's message comes back while its lease still holds the key. On
// Redis Streams, another consumer claims a message a live one still
// handles. The error matches [ErrInvalidConfig] and names both values.
// Call it at start-up:
//
//	if err := cfg.CheckLease(once); err != nil {
//		return err // or log it as a warning
//	}
func (c Config) CheckLease(once *idempotency.Once) error {
	ep, err := parseEndpoint(c.URL)
	if err != nil {
		return err
	}
	lease := once.Config().LeaseTTL
	if ep.Redelivery == 0 || lease < ep.Redelivery {
		return nil
	}
	return fmt.Errorf("%w: the lease is %s and %s redelivers after %s (%s): lower the lease or raise %s",
		ErrInvalidConfig, lease, ep.Broker, ep.Redelivery, ep.RedeliveryParam, ep.RedeliveryParam)
}
