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

type options struct {
	ackWait       time.Duration
	maxAckPending int
}

// defaultAckWait stays above the idempotency lease (40 s).
const defaultAckWait = 60 * time.Second

// parseURL reads nats://[user:pass@]host:4222[,host2:4222][?parameters].
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

// open builds a JetStream publisher and subscriber (see the package doc).
// The backend creates the durables: nats.go deletes one its subscription
// created, and the group would replay the stream from the start.
func open(cfg brokerkit.Settings, ep brokerkit.Endpoint, logger watermill.LoggerAdapter) (brokerkit.Clients, error) {
	o := ep.Options.(options)
	connect := func(role string) (*nats.Conn, nats.JetStreamContext, error) {
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
			// Not ConnectedUrlRedacted: it shows a token.
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

// natsName makes s a stream or consumer name, hashed when changed or long.
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

// natsDurable names a group's durable consumer (and deliver group) on a topic.
func natsDurable(group, topic string) string {
	return natsName(group + "_" + topic)
}

// ensureStream returns the stream capturing topic, creating one if none does.
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

// natsPublisher is watermill-nats's publisher that reads the PubAck,
// which tells of a message dropped as a duplicate. It sets no Nats-Msg-Id.
type natsPublisher struct {
	conn    *nats.Conn
	js      nats.JetStreamContext
	streams *brokerkit.TopicSet[string]
	logger  watermill.LoggerAdapter
}

var _ message.Publisher = (*natsPublisher)(nil)

// Publish publishes msgs in order, creating the stream if none captures
// topic, and stops at the first not stored (ErrDuplicatePublish too).
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
			// The stream was deleted since: nothing was stored; create it again.
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

// Close flushes and closes the publisher's connection. It is idempotent.
func (p *natsPublisher) Close() error {
	if !p.conn.IsClosed() {
		_ = p.conn.FlushTimeout(5 * time.Second)
	}
	p.conn.Close()
	return nil
}
