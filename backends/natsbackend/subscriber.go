package natsbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// natsSubscriber replaces watermill-nats's, whose close races its
// callbacks. It binds to the group's durable, which it creates first.
type natsSubscriber struct {
	conn          *nats.Conn
	js            nats.JetStreamContext
	streams       *brokerkit.TopicSet[string]
	group         string
	ackWait       time.Duration
	maxAckPending int
	nakDelay      time.Duration
	logger        watermill.LoggerAdapter

	brokerkit.Closer // its Mu also guards consumers
	consumers        map[string]bool
	subs             sync.WaitGroup

	// epochs counts each topic's durables created again: settling a message
	// of a deleted stream would settle another with its sequence number.
	// settling guards epochs, held while one is sent.
	settling sync.RWMutex
	epochs   map[string]uint64
}

var (
	_ message.Subscriber           = (*natsSubscriber)(nil)
	_ message.SubscribeInitializer = (*natsSubscriber)(nil)
)

// durableCheckInterval: JetStream tells a queue subscription nothing of a deletion.
const durableCheckInterval = 5 * time.Second

// Subscribe joins the group's durable consumer of topic until ctx ends or
// the subscriber closes, and subscribes anew if the durable disappears.
func (s *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	stream, durable, err := s.initialize(topic)
	if err != nil {
		return nil, err
	}
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.Closed {
		return nil, errors.New("backends: nats subscriber closed")
	}

	out := make(chan *message.Message)
	stop := make(chan struct{})
	// inflight is read-held by callbacks that may send on out.
	var inflight sync.RWMutex
	subscribe := func(stream string) (*nats.Subscription, watermill.LogFields, error) {
		logFields := watermill.LogFields{"topic": topic, "nats_stream": stream, "nats_durable": durable}
		sub, err := s.js.QueueSubscribe(topic, durable, func(m *nats.Msg) {
			inflight.RLock()
			defer inflight.RUnlock()
			select {
			case <-stop:
				_ = m.Nak()
				return
			default:
			}
			s.handle(ctx, m, out, stop, s.settler(topic), logFields)
		}, nats.Bind(stream, durable), nats.ManualAck())
		if err != nil {
			return nil, nil, fmt.Errorf("backends: nats subscribe %q as %q: %w", topic, durable, err)
		}
		return sub, logFields, nil
	}
	sub, logFields, err := subscribe(stream)
	if err != nil {
		return nil, err
	}
	_, created := s.durableGone(ctx, stream, durable)
	// We created the durable, so Unsubscribe leaves it on the server.
	unsubscribe := func(sub *nats.Subscription, logFields watermill.LogFields) {
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.logger.Error("Cannot unsubscribe", err, logFields)
		}
	}

	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		checkCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-s.Closing:
				cancel()
			case <-checkCtx.Done():
			}
		}()
		check := time.NewTicker(durableCheckInterval)
		defer check.Stop()
	watch:
		for {
			select {
			case <-ctx.Done():
				break watch
			case <-s.Closing:
				break watch
			case <-check.C:
			}
			if sub != nil {
				gone, c := s.durableGone(checkCtx, stream, durable)
				if !gone && (c.IsZero() || created.IsZero() || c.Equal(created)) {
					if created.IsZero() {
						created = c
					}
					continue
				}
				// Unsubscribe first: two subscriptions would share the new durable.
				s.logger.Info("The group's durable is gone or new (its stream deleted?); subscribing anew", logFields)
				unsubscribe(sub, logFields)
				sub = nil
			}
			next, err := s.recreate(topic)
			if err == nil {
				var nextFields watermill.LogFields
				if sub, nextFields, err = subscribe(next); err == nil {
					stream, logFields = next, nextFields
					_, created = s.durableGone(checkCtx, stream, durable)
				}
			}
			if err != nil {
				s.logger.Error("Cannot create the group's durable again; retrying", err, logFields)
			}
		}
		close(stop)
		if sub != nil {
			unsubscribe(sub, logFields)
		}
		inflight.Lock()
		close(out)
		inflight.Unlock()
	}()
	return out, nil
}

// durableGone reports durable or its stream missing, else its creation time.
func (s *natsSubscriber) durableGone(ctx context.Context, stream, durable string) (bool, time.Time) {
	ctx, cancel := context.WithTimeout(ctx, durableCheckInterval)
	defer cancel()
	info, err := s.js.ConsumerInfo(stream, durable, nats.Context(ctx))
	if err != nil {
		return errors.Is(err, nats.ErrConsumerNotFound) || errors.Is(err, nats.ErrStreamNotFound), time.Time{}
	}
	return false, info.Created
}

// newEpoch stops the settling of what topic's durable delivered before.
func (s *natsSubscriber) newEpoch(topic string) {
	s.settling.Lock()
	defer s.settling.Unlock()
	s.epochs[topic]++
}

// settler runs send, and reports true, unless topic's durable is new since.
func (s *natsSubscriber) settler(topic string) func(send func()) bool {
	s.settling.RLock()
	epoch := s.epochs[topic]
	s.settling.RUnlock()
	return func(send func()) bool {
		s.settling.RLock()
		defer s.settling.RUnlock()
		if s.epochs[topic] != epoch {
			return false
		}
		send()
		return true
	}
}

// recreate forgets topic's stream and durable and sets both up again.
func (s *natsSubscriber) recreate(topic string) (string, error) {
	s.newEpoch(topic)
	s.streams.Forget(topic)
	s.Mu.Lock()
	delete(s.consumers, topic)
	s.Mu.Unlock()
	stream, _, err := s.initialize(topic)
	return stream, err
}

// handle hands m to out and settles it, by settle, as the handler does.
func (s *natsSubscriber) handle(ctx context.Context, m *nats.Msg, out chan<- *message.Message, stop <-chan struct{}, settle func(func()) bool, logFields watermill.LogFields) {
	msg, joined := natsUnmarshal(m)
	if len(joined) > 0 {
		s.logger.Info("Message has headers with several values, handed on joined", logFields.Add(watermill.LogFields{
			"message_uuid": msg.UUID, "joined_headers": strings.Join(joined, ","),
		}))
	}
	msgCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg.SetContext(msgCtx)
	logFields = logFields.Add(watermill.LogFields{"message_uuid": msg.UUID})

	timeout := time.NewTimer(s.ackWait)
	defer timeout.Stop()
	select {
	case out <- msg:
	case <-stop:
		_ = m.Nak()
		return
	case <-ctx.Done():
		_ = m.Nak()
		return
	case <-timeout.C:
		// The server redelivers it already.
		return
	}
	// Restart AckWait: it may have waited in the client behind another.
	stale := func() {
		s.logger.Info("The group's durable was created again since this message came: not settled, "+
			"its stream sequence names another message now", logFields)
	}
	send := func(what string, f func() error) {
		if !settle(func() {
			if err := f(); err != nil {
				s.logger.Error(what, err, logFields)
			}
		}) {
			stale()
		}
	}
	send("Cannot extend AckWait of a message handed to its handler", func() error { return m.InProgress() })
	ack := func() { send("Cannot ack message", func() error { return m.AckSync() }) }
	nack := func() { send("Cannot nack message", func() error { return m.NakWithDelay(s.nakDelay) }) }
	// A progress ack every AckWait/3 keeps a slow handler's message.
	progress := time.NewTicker(max(s.ackWait/3, time.Millisecond))
	defer progress.Stop()
	for {
		select {
		case <-msg.Acked():
			ack()
			return
		case <-msg.Nacked():
			nack()
			return
		case <-progress.C:
			send("Cannot extend AckWait of a message in progress", func() error { return m.InProgress() })
		case <-stop:
			brokerkit.SettleOnStop(msg, ack, nack, func() { settle(func() { _ = m.Nak() }) })
			return
		case <-ctx.Done():
			brokerkit.SettleOnStop(msg, ack, nack, func() { settle(func() { _ = m.Nak() }) })
			return
		}
	}
}

// SubscribeInitialize creates the topic's stream and the group's durable.
func (s *natsSubscriber) SubscribeInitialize(topic string) error {
	_, _, err := s.initialize(topic)
	return err
}

func (s *natsSubscriber) initialize(topic string) (stream, durable string, err error) {
	stream, err = ensureStream(s.streams, s.js, topic)
	if err != nil {
		return "", "", err
	}
	durable = natsDurable(s.group, topic)
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.consumers[topic] {
		return stream, durable, nil
	}
	want := &nats.ConsumerConfig{
		Durable:        durable,
		DeliverSubject: "_wmi.deliver." + stream + "." + durable,
		DeliverGroup:   durable,
		FilterSubject:  topic,
		DeliverPolicy:  nats.DeliverAllPolicy,
		AckPolicy:      nats.AckExplicitPolicy,
		AckWait:        s.ackWait,
		MaxAckPending:  s.maxAckPending,
		ReplayPolicy:   nats.ReplayInstantPolicy,
	}
	info, err := s.js.ConsumerInfo(stream, durable)
	switch {
	case errors.Is(err, nats.ErrConsumerNotFound):
		_, err = s.js.AddConsumer(stream, want)
	case err == nil && (info.Config.AckWait != want.AckWait || info.Config.MaxAckPending != want.MaxAckPending):
		updated := info.Config
		updated.AckWait, updated.MaxAckPending = want.AckWait, want.MaxAckPending
		_, err = s.js.UpdateConsumer(stream, &updated)
	}
	if err != nil {
		return "", "", fmt.Errorf("backends: nats durable %q on stream %q: %w", durable, stream, err)
	}
	s.consumers[topic] = true
	return stream, durable, nil
}

// Close ends the subscriptions, nacking held messages, and drains the
// connection. It is idempotent.
func (s *natsSubscriber) Close() error {
	if !s.MarkClosed() {
		return nil
	}
	s.subs.Wait()
	if err := s.conn.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("backends: nats drain: %w", err)
	}
	return nil
}

// natsUnmarshal is watermill-nats's NATSMarshaler that never fails: a
// header of several values is joined by ", " and named in joined.
func natsUnmarshal(m *nats.Msg) (msg *message.Message, joined []string) {
	md := make(message.Metadata, len(m.Header))
	for k, v := range m.Header {
		switch k {
		case wmnats.WatermillUUIDHdr, nats.MsgIdHdr, nats.ExpectedLastMsgIdHdr, nats.ExpectedStreamHdr,
			nats.ExpectedLastSubjSeqHdr, nats.ExpectedLastSeqHdr:
			continue
		}
		if len(v) > 1 {
			joined = append(joined, k)
		}
		md.Set(k, strings.Join(v, ", "))
	}
	slices.Sort(joined)
	// A repeated UUID header keeps its first value.
	msg = message.NewMessage(m.Header.Get(wmnats.WatermillUUIDHdr), m.Data)
	msg.Metadata = md
	return msg, joined
}
