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
// Choices over watermill-nats's defaults, each a trap:
//   - ManualAck: without it nats.go acks every message as soon as the
//     callback returns, before the handler has run, and a crash loses it;
//   - AckExplicit, with the server-side AckWait set to NATS.AckWait (and the
//     subscriber's own wait to the same), and MaxAckPending bounded;
//   - the durable consumer is created by the backend before the library
//     subscribes. nats.go deletes a consumer on Unsubscribe when it created
//     it itself, which watermill-nats does on Close: the durable of the
//     whole group would vanish with its first member to shut down, and the
//     next start would replay the stream from the beginning. Created here,
//     the durable survives every shutdown and keeps the group's position;
//     delete it with the nats CLI when a group is retired;
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
	sub, err := wmnats.NewSubscriberWithNatsConn(subConn, wmnats.SubscriberSubscriptionConfig{
		Unmarshaler:       &wmnats.NATSMarshaler{},
		SubscribersCount:  1,
		AckWaitTimeout:    cfg.NATS.AckWait,
		SubscribeTimeout:  cfg.DialTimeout,
		SubjectCalculator: subjects,
		NakDelay:          wmnats.NewStaticDelay(cfg.NackResendSleep),
		QueueGroupPrefix:  cfg.Group,
		JetStream: wmnats.JetStreamConfig{
			SubscribeOptions:  []nats.SubOpt{nats.ManualAck(), nats.AckExplicit()},
			DurablePrefix:     cfg.Group,
			DurableCalculator: natsDurable,
		},
	}, logger)
	if err != nil {
		subConn.Close()
		return nil, errors.Join(fmt.Errorf("backends: nats subscriber: %w", err), pub.Close())
	}

	return &Backend{
		Publisher: &natsPublisher{pub: pub, js: pubJS, streams: streams},
		Subscriber: &natsSubscriber{
			sub:           sub,
			js:            subJS,
			streams:       streams,
			group:         cfg.Group,
			ackWait:       cfg.NATS.AckWait,
			maxAckPending: cfg.NATS.MaxAckPending,
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

// natsSubscriber creates the stream and the group's durable consumer before
// the library subscribes, so that the library binds to the durable instead of
// creating (and, on Close, deleting) it.
type natsSubscriber struct {
	sub           *wmnats.Subscriber
	js            nats.JetStreamContext
	streams       *natsStreams
	group         string
	ackWait       time.Duration
	maxAckPending int

	mu        sync.Mutex
	consumers map[string]bool
}

var (
	_ message.Subscriber           = (*natsSubscriber)(nil)
	_ message.SubscribeInitializer = (*natsSubscriber)(nil)
)

func (s *natsSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, err
	}
	return s.sub.Subscribe(ctx, topic)
}

// SubscribeInitialize creates the topic's stream and the group's durable
// consumer, if missing, and brings the durable's AckWait and MaxAckPending
// in line with the config.
func (s *natsSubscriber) SubscribeInitialize(topic string) error {
	stream, err := s.streams.ensure(s.js, topic)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.consumers == nil {
		s.consumers = map[string]bool{}
	}
	if s.consumers[topic] {
		return nil
	}
	durable := natsDurable(s.group, topic)
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
		return fmt.Errorf("backends: nats durable %q on stream %q: %w", durable, stream, err)
	}
	s.consumers[topic] = true
	return nil
}

func (s *natsSubscriber) Close() error { return s.sub.Close() }
