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
// Each owns its connection, so closing one never breaks the other (but on
// gochannel, where both are one instance).
type Backend struct {
	// Publisher publishes to the broker.
	Publisher message.Publisher
	// Subscriber consumes as Config.Group. Two handlers of one topic on
	// it divide the messages: see SubscriberForGroup.
	Subscriber message.Subscriber

	broker brokerkit.Broker
	// newSubscriber builds a Subscriber of the broker for a group.
	newSubscriber func(group string) (message.Subscriber, error)
	// group is Config.Group, which SubscriberForGroup refuses.
	group string

	mu     sync.Mutex
	others []message.Subscriber // built by SubscriberForGroup, closed by Close
	closed bool                 // Close ran: SubscriberForGroup refuses
}

// SubscriberForGroup returns a Subscriber of the same broker and settings
// in another consumer group. That group receives every message of a topic,
// whatever the other groups do. Use one for each handler of a topic beyond
// the first:
//
//	router.AddConsumerHandler("charge", "orders", b.Subscriber, charge)
//	notify, err := b.SubscriberForGroup(cfg.Group + ".notify")
//	if err != nil { ... }
//	router.AddConsumerHandler("notify", "orders", notify, sendMail)
//
// Keep the name stable across restarts: a group's position lives under it.
// An empty group, or Config.Group itself, is an error. gochannel has no
// groups and ignores the name. The Subscriber owns its connection; a
// router or [Backend.Close] closes it. After Close it is an error.
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
		// Close ran meanwhile and will not see this one.
		return nil, errors.Join(errClosed, sub.Close())
	}
	b.others = append(b.others, sub)
	return sub, nil
}

// Close closes the Subscribers, those of SubscriberForGroup too, then the
// Publisher, and joins their errors. Closing what a router closed is
// harmless.
func (b *Backend) Close() error {
	var errs []error
	b.mu.Lock()
	others := b.others
	b.closed = true
	b.mu.Unlock()
	for _, sub := range others {
		if err := sub.Close(); err != nil {
			errs = append(errs, fmt.Errorf("backends: close %s subscriber: %w", b.broker, err))
		}
	}
	if b.Subscriber != nil {
		if err := b.Subscriber.Close(); err != nil {
			errs = append(errs, fmt.Errorf("backends: close %s subscriber: %w", b.broker, err))
		}
	}
	if b.Publisher != nil {
		if err := b.Publisher.Close(); err != nil {
			errs = append(errs, fmt.Errorf("backends: close %s publisher: %w", b.broker, err))
		}
	}
	return errors.Join(errs...)
}

// New builds the Publisher and Subscriber of the broker that cfg.URL names.
// It validates cfg first (see [Config.Validate]). A nil logger means
// [watermill.NopLogger]. New connects before it returns, and leaves nothing
// open on error: [ErrUnreachable] when the broker does not answer within
// cfg.DialTimeout, [ErrInvalidConfig] when it refuses the connection.
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

// dialAny returns nil as soon as one of addrs accepts a TCP connection, and
// otherwise an ErrUnreachable naming every address, after at most timeout.
// Client libraries retry and back off on their own, some for minutes; this
// check lets New fail fast and say where it looked. It dials every address
// at once: one that hangs would spend the whole timeout before the next.
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
