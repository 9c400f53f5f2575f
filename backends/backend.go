package backends

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// Backend is a Publisher and a Subscriber of one broker, built by [New].
// Each owns its connection (but on gochannel, where both are one).
type Backend struct {
	// Publisher publishes to the broker.
	Publisher message.Publisher
	// Subscriber consumes as Config.Group; see SubscriberForGroup.
	Subscriber message.Subscriber

	broker        brokerkit.Broker
	newSubscriber func(group string) (message.Subscriber, error)
	group         string // Config.Group, which SubscriberForGroup refuses

	mu     sync.Mutex
	others []message.Subscriber // built by SubscriberForGroup, closed by Close
	closed bool                 // Close ran: SubscriberForGroup refuses
}

// SubscriberForGroup returns a Subscriber of the broker in another consumer
// group, which receives every message of a topic. Use one for each handler
// of a topic beyond the first:
//
//	router.AddConsumerHandler("charge", "orders", b.Subscriber, charge)
//	notify, err := b.SubscriberForGroup(cfg.Group + ".notify")
//	router.AddConsumerHandler("notify", "orders", notify, sendMail)
//
// Keep the name stable: a group's position lives under it. An empty group,
// Config.Group, or a closed Backend is an error; gochannel ignores the
// name. A router or [Backend.Close] closes the Subscriber.
func (b *Backend) SubscriberForGroup(group string) (message.Subscriber, error) {
	group = strings.TrimSpace(group)
	if group == "" && b.broker != brokerkit.GoChannel {
		return nil, fmt.Errorf("%w: missing consumer group: SubscriberForGroup needs one", ErrInvalidConfig)
	}
	if b.newSubscriber == nil {
		return nil, errors.New("backends: SubscriberForGroup on a Backend not built by New")
	}
	if b.broker != brokerkit.GoChannel && group == b.group {
		return nil, fmt.Errorf("backends: SubscriberForGroup(%q) is Config.Group: its handlers would divide the "+
			"messages with Backend.Subscriber's; name another group", group)
	}
	errClosed := errors.New("backends: SubscriberForGroup on a closed Backend")
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	sub, err := b.newSubscriber(group)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		// Close ran meanwhile without this one.
		return nil, errors.Join(errClosed, sub.Close())
	}
	b.others = append(b.others, sub)
	return sub, nil
}

// Close closes the Subscribers, SubscriberForGroup's too, then the
// Publisher, and joins their errors. Closing twice is harmless.
func (b *Backend) Close() error {
	var errs []error
	b.mu.Lock()
	others := b.others
	b.closed = true
	b.mu.Unlock()
	closeOne := func(what string, c interface{ Close() error }) {
		if c == nil {
			return
		}
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("backends: close %s %s: %w", b.broker, what, err))
		}
	}
	for _, sub := range others {
		closeOne("subscriber", sub)
	}
	closeOne("subscriber", b.Subscriber)
	closeOne("publisher", b.Publisher)
	return errors.Join(errs...)
}

// New builds the Publisher and Subscriber of the broker cfg.URL names,
// after [Config.Validate]; a nil logger means [watermill.NopLogger]. It
// connects first, and leaves nothing open on error.
func New(cfg Config, logger watermill.LoggerAdapter) (*Backend, error) {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ep, err := parseEndpoint(cfg.URL)
	if err != nil {
		return nil, err
	}
	d, _ := brokerkit.Lookup(ep.Broker)
	s := cfg.settings()
	logger = logger.With(watermill.LogFields{"broker": string(ep.Broker), "consumer_group": s.Group})
	if len(ep.Addrs) > 0 {
		if err := dialAny(ep, s.DialTimeout); err != nil {
			return nil, err
		}
	}
	c, err := d.Open(s, ep, logger)
	if err != nil {
		return nil, err
	}
	return &Backend{
		broker:        ep.Broker,
		Publisher:     c.Publisher,
		Subscriber:    c.Subscriber,
		newSubscriber: c.NewSubscriber,
		group:         s.Group,
	}, nil
}

// dialAny dials every address at once, within timeout (libraries retry for
// minutes): nil once one accepts, else an ErrUnreachable naming each.
func dialAny(ep brokerkit.Endpoint, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := make([]string, len(ep.Addrs))
	var answered atomic.Bool
	var wg sync.WaitGroup
	for i, addr := range ep.Addrs {
		wg.Go(func() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				errs[i] = err.Error()
				return
			}
			_ = c.Close()
			answered.Store(true)
			cancel() // the others need not go on
		})
	}
	wg.Wait()
	if answered.Load() {
		return nil
	}
	return ep.Unreachable(timeout, errors.New(strings.Join(errs, "; ")))
}
