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

// natsSubscriber consumes a topic through the group's durable consumer,
// which it creates (with the topic's stream) before subscribing, so that
// nats.go binds to it instead of creating, and on close deleting, it; and
// again when it finds the durable gone (its stream deleted) while it runs.
//
// It replaces watermill-nats's Subscriber, which closes its output channel
// while a message callback may still be sending on it (a data race, and a
// "send on closed channel" panic when the timing is unlucky). Messages are
// handled as there: one at a time per subscription, acked with AckSync after
// the handler acks, NakWithDelay(NackResendSleep) after it nacks, with
// progress acks (InProgress) when the handler receives it and every
// AckWait/3 while the handler runs, so the server redelivers only what a
// dead consumer held, or what waited in the client longer than AckWait.
// Headers are read by natsUnmarshal, which never fails. A message held when the
// subscriber closes is nacked without delay, so another member of the group
// gets it at once.
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

	// epochs counts, per topic, the group's durables seen created again:
	// a message delivered in an earlier epoch came from a deleted stream,
	// whose sequence numbers the new one uses again, so its ack, nack or
	// progress ack would settle another message. settling guards epochs,
	// and is held while one is sent.
	settling sync.RWMutex
	epochs   map[string]uint64
}

var (
	_ message.Subscriber           = (*natsSubscriber)(nil)
	_ message.SubscribeInitializer = (*natsSubscriber)(nil)
)

// durableCheckInterval is how often a subscription checks that its durable
// still exists. JetStream tells a push consumer's subscribers nothing when
// the consumer or its stream is deleted, and nats.go allows no idle
// heartbeats on a queue subscription, so the subscription asks.
const durableCheckInterval = 5 * time.Second

// Subscribe joins the group's durable consumer of topic. The returned
// channel closes when ctx ends or the subscriber closes. While it runs, it
// checks every durableCheckInterval that the durable exists, and creates it
// (and the stream) again and subscribes anew when it does not.
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
	// inflight is held (read-locked) by the message callbacks while they may
	// send on out; teardown takes it write-locked before closing out.
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
	// The durable was created by us, not by a subscription, so Unsubscribe
	// leaves it on the server.
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
				// Gone, or created again by another process: what the old
				// subscription holds or buffers came from the deleted
				// stream, whose sequence numbers the new one uses again.
				s.logger.Info("The group's durable is gone or new (its stream deleted?); subscribing anew", logFields)
				// Before the durable is back: two subscriptions on its deliver
				// subject would share its messages, and those buffered for the
				// old one would be dropped with it, to come back only after
				// AckWait.
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

// durableGone reports whether durable or its stream is missing on the
// server, and else when the durable was created (zero if unknown). Any
// other answer, or none, counts as present: the next check asks again.
func (s *natsSubscriber) durableGone(ctx context.Context, stream, durable string) (bool, time.Time) {
	ctx, cancel := context.WithTimeout(ctx, durableCheckInterval)
	defer cancel()
	info, err := s.js.ConsumerInfo(stream, durable, nats.Context(ctx))
	if err != nil {
		return errors.Is(err, nats.ErrConsumerNotFound) || errors.Is(err, nats.ErrStreamNotFound), time.Time{}
	}
	return false, info.Created
}

// newEpoch starts a new epoch of topic's durable: what was delivered
// before is settled no more.
func (s *natsSubscriber) newEpoch(topic string) {
	s.settling.Lock()
	defer s.settling.Unlock()
	s.epochs[topic]++
}

// settler returns how a message of topic delivered now is settled: send
// runs unless the durable was created again since, and reports whether it
// ran.
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

// recreate forgets what this process knew of topic's stream and durable and
// sets both up again, as Subscribe does: the stream that captures topic
// now, or a new one, and the group's durable on it. It returns the stream.
func (s *natsSubscriber) recreate(topic string) (string, error) {
	s.newEpoch(topic)
	s.streams.Forget(topic)
	s.Mu.Lock()
	delete(s.consumers, topic)
	s.Mu.Unlock()
	stream, _, err := s.initialize(topic)
	return stream, err
}

// handle hands one message to out and settles it on the server as the
// handler settles it.
// settle sends what settles m unless its durable was created again since
// it was delivered.
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
		// Nobody took it within AckWait; the server redelivers it already.
		return
	}
	// The handler has it now, but its AckWait has run since the server sent
	// it, while it waited in the client behind a slow predecessor: restart
	// the clock, or a message that waited longer than two thirds of AckWait
	// would be redelivered before the first progress ack below.
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
	// The handler has it: tell the server it is still being worked on, every
	// third of AckWait, so that a slow handler is neither redelivered nor
	// interrupted (its context stays live until it answers). A consumer that
	// dies stops these progress acks, and the server redelivers after AckWait.
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

// SubscribeInitialize creates the topic's stream and the group's durable
// consumer, if missing, and brings the durable's AckWait and MaxAckPending
// in line with the config.
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

// Close ends every subscription, nacking held messages, waits until their
// channels are closed, and drains the connection. It is idempotent.
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

// natsUnmarshal reads a JetStream message as watermill-nats's NATSMarshaler
// does (the UUID from its header, every other header as metadata, the
// headers JetStream uses for deduplication and expectations left out), but
// never fails: a header with several values, which JetStream carries and
// NATSMarshaler rejects, becomes one metadata value with the values joined
// by ", " in order (as HTTP joins a repeated field), where NATSMarshaler's
// error would leave the message nowhere to go but terminated. joined names
// such headers.
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
	// A repeated UUID header keeps its first value, as nats.Header.Get reads.
	msg = message.NewMessage(m.Header.Get(wmnats.WatermillUUIDHdr), m.Data)
	msg.Metadata = md
	return msg, joined
}
