package backends

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
)

// newNATS builds a NATS JetStream publisher and subscriber.
//
// Every topic is a subject captured by a stream: an existing stream that
// captures it, or else one the backend creates, named after the topic, with
// JetStream's defaults (file storage, limits retention, no size or age
// limit, 2-minute duplicate window). Each group reads a topic through a
// durable push consumer named group_topic, with a deliver group of the same
// name, so the processes of a group share its messages.
//
// Publishing goes through watermill-nats; subscribing through natsSubscriber
// (see there for why). Choices, each against a trap:
//   - ManualAck: without it nats.go acks every message as soon as the
//     callback returns, before the handler has run, and a crash loses it;
//   - AckExplicit, with the server-side AckWait set to NATS.AckWait (and the
//     subscriber's own wait to the same), and MaxAckPending bounded;
//   - the durable consumer is created by the backend and subscriptions bind
//     to it. nats.go deletes a consumer on Unsubscribe when the subscription
//     created it: the durable of the whole group would vanish with its first
//     member to shut down, and the next start would replay the stream from
//     the beginning. Created here, the durable survives every shutdown and
//     keeps the group's position; delete it with the nats CLI when a group
//     is retired;
//   - one durable per topic and group (watermill-nats uses the group alone
//     by default, which allows one topic per group);
//   - a nack asks the server to redeliver after NackResendSleep
//     (NakWithDelay), without holding back the messages behind it;
//   - publishes carry the message UUID as Nats-Msg-Id, so JetStream drops a
//     republished message (same UUID) within its duplicate window;
//   - reconnects never give up (nats.go stops after 60 attempts).
func newNATS(cfg Config, ep endpoint, logger watermill.LoggerAdapter) (*Backend, error) {
	if err := dialAny(NATS, ep.addrs, cfg.DialTimeout); err != nil {
		return nil, err
	}
	connect := func(role string) (*nats.Conn, nats.JetStreamContext, error) {
		conn, err := nats.Connect(ep.url,
			nats.Name(cfg.Consumer+"-"+role),
			nats.Timeout(cfg.DialTimeout),
			nats.MaxReconnects(-1),
		)
		if err != nil {
			return nil, nil, unreachable(NATS, ep.addrs, cfg.DialTimeout, err)
		}
		js, err := conn.JetStream(nats.MaxWait(cfg.DialTimeout))
		if err == nil {
			_, err = js.AccountInfo()
		}
		if err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("backends: nats at %s: JetStream not available: %w", conn.ConnectedUrlRedacted(), err)
		}
		return conn, js, nil
	}

	streams := &natsStreams{known: map[string]string{}}
	subjects := func(group, topic string) *wmnats.SubjectDetail {
		return &wmnats.SubjectDetail{Primary: topic, QueueGroup: natsDurable(group, topic)}
	}

	pubConn, pubJS, err := connect("pub")
	if err != nil {
		return nil, err
	}
	pub, err := wmnats.NewPublisherWithNatsConn(pubConn, wmnats.PublisherPublishConfig{
		Marshaler:         &wmnats.NATSMarshaler{},
		SubjectCalculator: subjects,
		JetStream:         wmnats.JetStreamConfig{TrackMsgId: true},
	}, logger)
	if err != nil {
		pubConn.Close()
		return nil, fmt.Errorf("backends: nats publisher: %w", err)
	}

	subConn, subJS, err := connect("sub")
	if err != nil {
		return nil, errors.Join(err, pub.Close())
	}
	return &Backend{
		Publisher: &natsPublisher{pub: pub, js: pubJS, streams: streams},
		Subscriber: &natsSubscriber{
			conn:          subConn,
			js:            subJS,
			streams:       streams,
			group:         cfg.Group,
			ackWait:       cfg.NATS.AckWait,
			maxAckPending: cfg.NATS.MaxAckPending,
			nakDelay:      cfg.NackResendSleep,
			logger:        logger,
			closing:       make(chan struct{}),
			consumers:     map[string]bool{},
		},
	}, nil
}

var invalidNATSNameChars = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// natsName turns s into a stream or consumer name: those may not hold '.',
// '*', '>' or white space. When s has to change, or is long, a hash of the
// original keeps two names that map to the same text apart.
func natsName(s string) string {
	clean := invalidNATSNameChars.ReplaceAllString(s, "_")
	if clean == s && len(s) <= 64 {
		return s
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	if len(clean) > 48 {
		clean = clean[:48]
	}
	return fmt.Sprintf("%s_%08x", clean, h.Sum32())
}

// natsDurable names the durable consumer (and its deliver group) of a group
// on a topic. Its signature is watermill-nats's DurableCalculator.
func natsDurable(group, topic string) string {
	return natsName(group + "_" + topic)
}

// natsStreams remembers, per process, the stream that captures each topic.
type natsStreams struct {
	mu    sync.Mutex
	known map[string]string
}

// ensure returns the stream capturing topic, creating one if none does.
func (s *natsStreams) ensure(js nats.JetStreamContext, topic string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name, ok := s.known[topic]; ok {
		return name, nil
	}
	name, err := js.StreamNameBySubject(topic)
	if errors.Is(err, nats.ErrNoMatchingStream) || errors.Is(err, nats.ErrStreamNotFound) {
		var info *nats.StreamInfo
		info, err = js.AddStream(&nats.StreamConfig{Name: natsName(topic), Subjects: []string{topic}})
		if err == nil {
			name = info.Config.Name
		}
	}
	if err != nil {
		return "", fmt.Errorf("backends: nats stream for %q: %w", topic, err)
	}
	s.known[topic] = name
	return name, nil
}

// natsPublisher makes sure a stream captures a topic before publishing to it.
type natsPublisher struct {
	pub     *wmnats.Publisher
	js      nats.JetStreamContext
	streams *natsStreams
}

var _ message.Publisher = (*natsPublisher)(nil)

func (p *natsPublisher) Publish(topic string, msgs ...*message.Message) error {
	if _, err := p.streams.ensure(p.js, topic); err != nil {
		return err
	}
	return p.pub.Publish(topic, msgs...)
}

func (p *natsPublisher) Close() error { return p.pub.Close() }

// natsSubscriber consumes a topic through the group's durable consumer,
// which it creates (with the topic's stream) before subscribing, so that
// nats.go binds to it instead of creating, and on close deleting, it.
//
// It replaces watermill-nats's Subscriber, which closes its output channel
// while a message callback may still be sending on it (a data race, and a
// "send on closed channel" panic when the timing is unlucky). Messages are
// handled as there: one at a time per subscription, acked with AckSync after
// the handler acks, NakWithDelay(NackResendSleep) after it nacks, with
// progress acks (InProgress) every AckWait/3 while the handler runs, so the
// server redelivers only what a dead consumer held. A message held when the
// subscriber closes is nacked without delay, so another member of the group
// gets it at once.
type natsSubscriber struct {
	conn          *nats.Conn
	js            nats.JetStreamContext
	streams       *natsStreams
	group         string
	ackWait       time.Duration
	maxAckPending int
	nakDelay      time.Duration
	logger        watermill.LoggerAdapter

	mu        sync.Mutex // guards closed and consumers, and orders Subscribe before Close
	closed    bool
	consumers map[string]bool
	closing   chan struct{}
	subs      sync.WaitGroup
}

var (
	_ message.Subscriber           = (*natsSubscriber)(nil)
	_ message.SubscribeInitializer = (*natsSubscriber)(nil)
)

// Subscribe joins the group's durable consumer of topic. The returned
// channel closes when ctx ends or the subscriber closes.
func (s *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	stream, durable, err := s.initialize(topic)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("backends: nats subscriber closed")
	}

	out := make(chan *message.Message)
	stop := make(chan struct{})
	// inflight is held (read-locked) by the message callback while it may
	// send on out; teardown takes it write-locked before closing out.
	var inflight sync.RWMutex
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
		s.handle(ctx, m, out, stop, logFields)
	}, nats.Bind(stream, durable), nats.ManualAck())
	if err != nil {
		return nil, fmt.Errorf("backends: nats subscribe %q as %q: %w", topic, durable, err)
	}

	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		close(stop)
		// The durable was created by us, not by this subscription, so
		// Unsubscribe leaves it on the server.
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			s.logger.Error("Cannot unsubscribe", err, logFields)
		}
		inflight.Lock()
		close(out)
		inflight.Unlock()
	}()
	return out, nil
}

// handle hands one message to out and settles it on the server as the
// handler settles it.
func (s *natsSubscriber) handle(ctx context.Context, m *nats.Msg, out chan<- *message.Message, stop <-chan struct{}, logFields watermill.LogFields) {
	msg, err := (&wmnats.NATSMarshaler{}).Unmarshal(m)
	if err != nil {
		// Redelivering cannot fix it; Term stops the server from trying.
		s.logger.Error("Cannot unmarshal message, terminating it", err, logFields)
		_ = m.Term()
		return
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
	ack := func() {
		if err := m.AckSync(); err != nil {
			s.logger.Error("Cannot ack message", err, logFields)
		}
	}
	nack := func() {
		if err := m.NakWithDelay(s.nakDelay); err != nil {
			s.logger.Error("Cannot nack message", err, logFields)
		}
	}
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
			if err := m.InProgress(); err != nil {
				s.logger.Error("Cannot extend AckWait of a message in progress", err, logFields)
			}
		case <-stop:
			settleOnStop(msg, ack, nack, func() { _ = m.Nak() })
			return
		case <-ctx.Done():
			settleOnStop(msg, ack, nack, func() { _ = m.Nak() })
			return
		}
	}
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

// SubscribeInitialize creates the topic's stream and the group's durable
// consumer, if missing, and brings the durable's AckWait and MaxAckPending
// in line with the config.
func (s *natsSubscriber) SubscribeInitialize(topic string) error {
	_, _, err := s.initialize(topic)
	return err
}

func (s *natsSubscriber) initialize(topic string) (stream, durable string, err error) {
	stream, err = s.streams.ensure(s.js, topic)
	if err != nil {
		return "", "", err
	}
	durable = natsDurable(s.group, topic)
	s.mu.Lock()
	defer s.mu.Unlock()
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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()

	s.subs.Wait()
	if err := s.conn.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("backends: nats drain: %w", err)
	}
	return nil
}
