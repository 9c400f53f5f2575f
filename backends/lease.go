package backends

import (
	"fmt"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// CheckLease checks the owner protocol's lease (once's LeaseTTL) is below
// the broker's redelivery timer: ack_wait on NATS, max_idle_time on Redis
// Streams. Other brokers always pass. A longer lease loses nothing, but
// redeliveries spin. The error matches [ErrInvalidConfig]. Call it at start-up:
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
