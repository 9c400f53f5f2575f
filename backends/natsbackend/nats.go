package natsbackend

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

func init() {
	brokerkit.Register(brokerkit.Driver{Broker: brokerkit.NATS, ParseURL: parseURL, Open: open})
}

// options are the backend's URL parameters of a nats:// URL.
type options struct {
	ackWait       time.Duration
	maxAckPending int
}

// defaultAckWait stays above the idempotency lease (40 s): a dead
// consumer's key is then free when its message comes back.
const defaultAckWait = 60 * time.Second

// parseURL reads nats://[user:pass@]host:4222[,host2:4222][?parameters]
// into the comma-separated list of full URLs that nats.Connect takes.
func parseURL(raw string) (brokerkit.Endpoint, error) {
	rest, p, err := brokerkit.TakeParams(raw, "ack_wait", "max_ack_pending")
	if err != nil {
		return brokerkit.Endpoint{}, err
	}
	urls, addrs, err := brokerkit.HostList(rest, "4222", true, "")
	if err != nil {
		return brokerkit.Endpoint{}, err
	}
	o := options{ackWait: p.Duration("ack_wait", defaultAckWait), maxAckPending: int(p.Int("max_ack_pending", 100, 32))}
	return brokerkit.Endpoint{URL: urls, Addrs: addrs, Options: o, Redelivery: o.ackWait, RedeliveryParam: "ack_wait"}, p.Err()
}

// open builds a NATS JetStream publisher and subscriber.
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
//   - AckExplicit, with the server-side AckWait set to ack_wait (and the
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
//   - publishes carry no Nats-Msg-Id: JetStream would take the message
//     UUID for one and drop a message republished with its UUID unchanged
//     (Watermill's requeuer does that) within the stream's duplicate
//     window, while Publish returned nil. A publish that JetStream still
//     reports as a duplicate (the message's metadata set Nats-Msg-Id) is an
//     brokerkit.ErrDuplicatePublish;
//   - reconnects never give up (nats.go stops after 60 attempts).
func open(cfg brokerkit.Settings, ep brokerkit.Endpoint, logger watermill.LoggerAdapter) (brokerkit.Clients, error) {
	o := ep.Options.(options)
	connect := func(role string) (*nats.Conn, nats.JetStreamContext, error) {
		// nats.Connect(ep.URL, ...), with Config.Tune called last.
		opts := nats.GetDefaultOptions()
		opts.Servers = strings.Split(ep.URL, ",")
		opts.Name = cfg.Consumer + "-" + role
		opts.Timeout = cfg.DialTimeout
		opts.MaxReconnect = -1
		cfg.TuneClient(&opts)
		conn, err := opts.Connect()
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
			errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) {
			// The server's -ERR to CONNECT: credentials it refuses.
			return nil, nil, ep.Refused(err)
		}
		if err != nil {
			return nil, nil, ep.Unreachable(cfg.DialTimeout, err)
		}
		js, err := conn.JetStream(nats.MaxWait(cfg.DialTimeout))
		if err == nil {
			_, err = js.AccountInfo()
		}
		if err != nil {
			conn.Close()
			// Not ConnectedUrlRedacted: it shows a token, which is a user name.
			return nil, nil, fmt.Errorf("backends: nats at %s: JetStream not available: %w", strings.Join(ep.Addrs, ","), err)
		}
		return conn, js, nil
	}

	streams := brokerkit.NewTopicSet[string]()
	pubConn, pubJS, err := connect("pub")
	if err != nil {
		return brokerkit.Clients{}, err
	}
	pub := &natsPublisher{conn: pubConn, js: pubJS, streams: streams, logger: logger}

	newSubscriber := func(group string) (message.Subscriber, error) {
		conn, js, err := connect("sub")
		if err != nil {
			return nil, err
		}
		return &natsSubscriber{
			conn:          conn,
			js:            js,
			streams:       streams,
			group:         group,
			ackWait:       o.ackWait,
			maxAckPending: o.maxAckPending,
			nakDelay:      cfg.NackResendSleep,
			logger:        logger,
			Closer:        brokerkit.NewCloser(),
			consumers:     map[string]bool{},
			epochs:        map[string]uint64{},
		}, nil
	}
	sub, err := newSubscriber(cfg.Group)
	if err != nil {
		return brokerkit.Clients{}, errors.Join(err, pub.Close())
	}
	return brokerkit.Clients{Publisher: pub, Subscriber: sub, NewSubscriber: newSubscriber}, nil
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
func ensureStream(streams *brokerkit.TopicSet[string], js nats.JetStreamContext, topic string) (string, error) {
	return streams.Ensure(topic, func(topic string) (string, error) {
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

// natsPublisher publishes to JetStream and waits for each PubAck, as
// watermill-nats's publisher does, but reads the PubAck: watermill-nats
// drops it, and with it JetStream's word that it dropped the message as a
// duplicate. It sets no Nats-Msg-Id of its own (see newNATS).
type natsPublisher struct {
	conn    *nats.Conn
	js      nats.JetStreamContext
	streams *brokerkit.TopicSet[string]
	logger  watermill.LoggerAdapter
}

var _ message.Publisher = (*natsPublisher)(nil)

// Publish publishes msgs to topic one after another, creating the topic's
// stream first if none captures it (again if it was deleted since), and returns at the first that JetStream
// did not store: an error, or a brokerkit.ErrDuplicatePublish for one it dropped as
// a duplicate of an earlier Nats-Msg-Id.
func (p *natsPublisher) Publish(topic string, msgs ...*message.Message) error {
	if _, err := ensureStream(p.streams, p.js, topic); err != nil {
		return err
	}
	for _, msg := range msgs {
		m, err := (&wmnats.NATSMarshaler{}).Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("backends: nats marshal message %s: %w", msg.UUID, err)
		}
		var opts []nats.PubOpt
		if _, ok := msg.Context().Deadline(); ok {
			// Without a deadline, the JetStream context's MaxWait bounds it.
			opts = append(opts, nats.Context(msg.Context()))
		}
		ack, err := p.js.PublishMsg(m, opts...)
		if errors.Is(err, nats.ErrNoStreamResponse) {
			// No stream captures the topic any more (deleted since this
			// process created or found it): nothing was stored, so create
			// it again and publish once more.
			p.streams.Forget(topic)
			if _, serr := ensureStream(p.streams, p.js, topic); serr != nil {
				return errors.Join(fmt.Errorf("backends: nats publish message %s to %q: %w", msg.UUID, topic, err), serr)
			}
			ack, err = p.js.PublishMsg(m, opts...)
		}
		if err != nil {
			return fmt.Errorf("backends: nats publish message %s to %q: %w", msg.UUID, topic, err)
		}
		if ack.Duplicate {
			return fmt.Errorf("%w: nats: JetStream dropped message %s on %q: stream %s already holds Nats-Msg-Id %q "+
				"(sequence %d) within its duplicate window", brokerkit.ErrDuplicatePublish, msg.UUID, topic, ack.Stream,
				m.Header.Get(nats.MsgIdHdr), ack.Sequence)
		}
	}
	return nil
}

// Close closes the publisher's connection, after flushing what it buffered.
// It is idempotent.
func (p *natsPublisher) Close() error {
	if !p.conn.IsClosed() {
		_ = p.conn.FlushTimeout(5 * time.Second)
	}
	p.conn.Close()
	return nil
}
