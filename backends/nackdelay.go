package backends

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// nackDelaySubscriber delays every nack by a fixed time before passing it to
// the wrapped Subscriber, for brokers whose library redelivers a nacked
// message at once (RabbitMQ requeues it to the head of the queue, gochannel
// resends it in a loop). Without it a failing handler, or a message whose
// idempotency key is in progress elsewhere, spins at full speed.
//
// Messages are handed on one at a time per subscription, as the wrapped
// libraries do themselves, so the delay holds back the messages behind the
// nacked one just as Kafka's and Redis Streams' NackResendSleep does.
type nackDelaySubscriber struct {
	sub   message.Subscriber
	delay time.Duration
	// keepOpen: Close stops this subscriber's subscriptions but leaves sub
	// open (a shared GoChannel that others still use).
	keepOpen bool
	// beforeNack, when set, runs before a nack is passed on, after the
	// delay, and every refreshEvery (when positive) during the delay; not
	// when the delay is cut short by the end of the message's context or by
	// Close.
	beforeNack   func(topic string, msg *message.Message)
	refreshEvery time.Duration

	closer
	wg      sync.WaitGroup
	cancels []context.CancelFunc // of the subscriptions, for keepOpen; guarded by mu
}

var (
	_ message.Subscriber           = (*nackDelaySubscriber)(nil)
	_ message.SubscribeInitializer = (*nackDelaySubscriber)(nil)
)

func newNackDelaySubscriber(sub message.Subscriber, delay time.Duration) *nackDelaySubscriber {
	return &nackDelaySubscriber{sub: sub, delay: delay, closer: newCloser()}
}

// Subscribe subscribes to topic on the wrapped Subscriber and relays its
// messages, delaying nacks.
func (s *nackDelaySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("backends: subscriber closed")
	}
	ctx, cancel := context.WithCancel(ctx)
	in, err := s.sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		return nil, err
	}
	s.cancels = append(s.cancels, cancel)
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		// Ranging until the wrapped Subscriber closes in, even after Close,
		// keeps it from blocking on a send nobody receives.
		for msg := range in {
			s.relay(topic, msg, out)
		}
	}()
	return out, nil
}

// relay hands a copy of msg to out and settles msg as the copy is settled,
// delaying a nack. A message that cannot be handed on (its context ended or
// the subscriber is closing) is nacked at once, so that the wrapped
// Subscriber requeues it instead of waiting for a settlement that never
// comes (watermill-amqp waits on Ack or Nack, not on the context). Once
// handed on, the copy is waited for until the consumer settles it or the
// subscriber closes: a router settles every message it received.
func (s *nackDelaySubscriber) relay(topic string, msg *message.Message, out chan<- *message.Message) {
	ctx := msg.Context()
	fwd := msg.Copy()
	fwd.SetContext(ctx)
	select {
	case out <- fwd:
	case <-ctx.Done():
		msg.Nack()
		return
	case <-s.closing:
		msg.Nack()
		return
	}
	select {
	case <-fwd.Acked():
		msg.Ack()
	case <-fwd.Nacked():
		if s.wait(ctx, topic, msg) && s.beforeNack != nil {
			s.beforeNack(topic, msg)
		}
		msg.Nack()
	case <-s.closing:
		settleOnStop(fwd, func() { msg.Ack() }, func() { msg.Nack() }, func() { msg.Nack() })
	}
}

// wait waits out the nack delay of msg, running beforeNack every
// refreshEvery meanwhile; false when ctx ended or the subscriber closed
// first.
func (s *nackDelaySubscriber) wait(ctx context.Context, topic string, msg *message.Message) bool {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	var refresh <-chan time.Time
	if s.beforeNack != nil && s.refreshEvery > 0 {
		tick := time.NewTicker(s.refreshEvery)
		defer tick.Stop()
		refresh = tick.C
	}
	for {
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		case <-s.closing:
			return false
		case <-refresh:
			s.beforeNack(topic, msg)
		}
	}
}

// SubscribeInitialize passes through to the wrapped Subscriber when it has
// one, and otherwise does nothing.
func (s *nackDelaySubscriber) SubscribeInitialize(topic string) error {
	if si, ok := s.sub.(message.SubscribeInitializer); ok {
		return si.SubscribeInitialize(topic)
	}
	return nil
}

// Close stops relaying, closes the wrapped Subscriber (with keepOpen, ends
// this subscriber's subscriptions on it instead) and waits until every
// output channel is closed. It is idempotent.
func (s *nackDelaySubscriber) Close() error {
	if !s.markClosed() {
		return nil
	}
	var err error
	if s.keepOpen {
		s.mu.Lock()
		for _, cancel := range s.cancels {
			cancel()
		}
		s.mu.Unlock()
	} else {
		err = s.sub.Close()
	}
	s.wg.Wait()
	s.mu.Lock()
	for _, cancel := range s.cancels {
		cancel()
	}
	s.mu.Unlock()
	return err
}

// settleOnStop settles a message when its subscription stops: as the handler
// did if it answered just before (select picks among ready cases at random,
// so an ack must not lose to the stop signal), else with abandon.
func settleOnStop(msg *message.Message, ack, nack, abandon func()) {
	select {
	case <-msg.Acked():
		ack()
	case <-msg.Nacked():
		nack()
	default:
		abandon()
	}
}
