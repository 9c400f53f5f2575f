package backends

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
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

	streams := newTopicSet[string]()
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
		Publisher: ensuringPublisher{Publisher: pub, ensure: func(topic string) error {
			_, err := ensureStream(streams, pubJS, topic)
			return err
		}},
		Subscriber: &natsSubscriber{
			conn:          subConn,
			js:            subJS,
			streams:       streams,
			group:         cfg.Group,
			ackWait:       cfg.NATS.AckWait,
			maxAckPending: cfg.NATS.MaxAckPending,
			nakDelay:      cfg.NackResendSleep,
			logger:        logger,
			closer:        newCloser(),
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

// ensureStream returns the stream capturing topic, creating one (named after
// the topic) if none does; streams remembers the answer per process.
func ensureStream(streams *topicSet[string], js nats.JetStreamContext, topic string) (string, error) {
	return streams.ensure(topic, func(topic string) (string, error) {
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
		return name, nil
	})
}
