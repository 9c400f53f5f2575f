package brokerkit

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// NackDelaySubscriber delays every nack by a fixed time before passing it to
// the wrapped Subscriber, for brokers whose library redelivers a nacked
// message at once (RabbitMQ requeues it to the head of the queue, gochannel
// resends it in a loop). Without it a failing handler, or a message whose
// idempotency key is in progress elsewhere, spins at full speed.
//
// Messages are handed on one at a time per subscription, as the wrapped
// libraries do themselves, so the delay holds back the messages behind the
// nacked one just as Kafka's and Redis Streams' NackResendSleep does.
//
// Set the exported fields before the first Subscribe.
type NackDelaySubscriber struct {
	// KeepOpen: Close stops this subscriber's subscriptions but leaves the
	// wrapped Subscriber open (a shared GoChannel that others still use).
	KeepOpen bool
	// BeforeNack, when set, runs before a nack is passed on, after the
	// delay, and every RefreshEvery (when positive) during the delay; not
	// when the delay is cut short by the end of the message's context or by
	// Close.
	BeforeNack   func(topic string, msg *message.Message)
	RefreshEvery time.Duration

	sub   message.Subscriber
	delay time.Duration
	Closer
	wg      sync.WaitGroup
	cancels []context.CancelFunc // of the subscriptions, for KeepOpen; guarded by Mu
}

var (
	_ message.Subscriber           = (*NackDelaySubscriber)(nil)
	_ message.SubscribeInitializer = (*NackDelaySubscriber)(nil)
)

// NewNackDelaySubscriber wraps sub, delaying each nack by delay.
func NewNackDelaySubscriber(sub message.Subscriber, delay time.Duration) *NackDelaySubscriber {
	return &NackDelaySubscriber{sub: sub, delay: delay, Closer: NewCloser()}
}

// Subscribe subscribes to topic on the wrapped Subscriber and relays its
// messages, delaying nacks.
func (s *NackDelaySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.Closed {
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
func (s *NackDelaySubscriber) relay(topic string, msg *message.Message, out chan<- *message.Message) {
	ctx := msg.Context()
	fwd := msg.Copy()
	fwd.SetContext(ctx)
	select {
	case out <- fwd:
	case <-ctx.Done():
		msg.Nack()
		return
	case <-s.Closing:
		msg.Nack()
		return
	}
	select {
	case <-fwd.Acked():
		msg.Ack()
	case <-fwd.Nacked():
		if s.wait(ctx, topic, msg) && s.BeforeNack != nil {
			s.BeforeNack(topic, msg)
		}
		msg.Nack()
	case <-s.Closing:
		SettleOnStop(fwd, func() { msg.Ack() }, func() { msg.Nack() }, func() { msg.Nack() })
	}
}

// wait waits out the nack delay of msg, running BeforeNack every
// RefreshEvery meanwhile; false when ctx ended or the subscriber closed
// first.
func (s *NackDelaySubscriber) wait(ctx context.Context, topic string, msg *message.Message) bool {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	var refresh <-chan time.Time
	if s.BeforeNack != nil && s.RefreshEvery > 0 {
		tick := time.NewTicker(s.RefreshEvery)
		defer tick.Stop()
		refresh = tick.C
	}
	for {
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		case <-s.Closing:
			return false
		case <-refresh:
			s.BeforeNack(topic, msg)
		}
	}
}

// SubscribeInitialize passes through to the wrapped Subscriber when it has
// one, and otherwise does nothing.
func (s *NackDelaySubscriber) SubscribeInitialize(topic string) error {
	if si, ok := s.sub.(message.SubscribeInitializer); ok {
		return si.SubscribeInitialize(topic)
	}
	return nil
}

// Close stops relaying, closes the wrapped Subscriber (with KeepOpen, ends
// this subscriber's subscriptions on it instead) and waits until every
// output channel is closed. It is idempotent.
func (s *NackDelaySubscriber) Close() error {
	if !s.MarkClosed() {
		return nil
	}
	var err error
	if s.KeepOpen {
		s.Mu.Lock()
		for _, cancel := range s.cancels {
			cancel()
		}
		s.Mu.Unlock()
	} else {
		err = s.sub.Close()
	}
	s.wg.Wait()
	s.Mu.Lock()
	for _, cancel := range s.cancels {
		cancel()
	}
	s.Mu.Unlock()
	return err
}
