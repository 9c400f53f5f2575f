package backends

import (
	"errors"
	"fmt"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// ErrLeaseNotBelowRedelivery is returned by CheckLease when the idempotency
// lease is not below the time after which the broker hands an unacked
// message to another consumer.
var ErrLeaseNotBelowRedelivery = errors.New("backends: the idempotency lease is not below the broker's redelivery timer")

// CheckLease checks once, the idempotency owner protocol, against the
// broker's redelivery timer: the lease (OnceConfig.LeaseTTL, defaults
// filled) must be below NATS.AckWait on NATS
// JetStream and below Redis.MaxIdleTime on Redis Streams (each zero
// meaning its default, 60 s). Otherwise a message whose consumer died
// comes back while the dead run's lease still holds its key, and is
// nacked as in progress until the lease lapses (NATS); or a message a live
// consumer is still handling is claimed by another consumer of the group
// every MaxIdleTime, since Redis Streams has no heartbeat (Redis Streams).
// Nothing is lost either way, but redeliveries spin and the handler's
// peers are kept busy. It returns an error matching
// ErrLeaseNotBelowRedelivery that names both values, or nil; Kafka, AMQP
// and gochannel have no such timer and always pass. It reads cfg.URL only
// for its scheme (a broker that is not linked is checked all the same): an
// invalid URL is the error of New.
//
// Call it at start-up, where both configs are known:
//
//	if err := cfg.CheckLease(once); err != nil {
//		return err // or log it as a warning
//	}
func (c Config) CheckLease(once *idempotency.Once) error {
	broker, err := brokerOf(c.URL)
	if err != nil {
		return err
	}
	c = c.withDefaults()
	lease := once.Config().LeaseTTL
	var timer time.Duration
	var name string
	switch broker {
	case NATS:
		timer, name = c.NATS.AckWait, "NATS.AckWait ("+EnvNATSAckWait+")"
	case RedisStreams:
		timer, name = c.Redis.MaxIdleTime, "Redis.MaxIdleTime ("+EnvRedisMaxIdleTime+")"
	default:
		return nil
	}
	if lease >= timer {
		return fmt.Errorf("%w: the lease is %s and %s is %s: lower the lease or raise %s",
			ErrLeaseNotBelowRedelivery, lease, name, timer, name)
	}
	return nil
}
