package backends

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// newAMQP builds an AMQP (RabbitMQ) publisher and subscriber on Watermill's
// durable pub/sub topology: one durable fanout exchange per topic, and one
// durable queue per topic and group, named topic_group. Subscribers of one
// group compete for the messages of its queue; every group's queue receives
// every message. Messages are published persistent.
//
// Choices over watermill-amqp's durable pub/sub config:
//   - publisher confirms: Publish returns only once RabbitMQ has taken
//     responsibility for the message;
//   - before its first publish to a topic the publisher declares and binds
//     the queues of AMQP.PublishGroups (default: Group), because a fanout
//     exchange drops what it cannot route, and until a group's subscriber
//     first starts its queue does not exist;
//   - Prefetch as configured (1 by default);
//   - a nack is held for NackResendSleep before RabbitMQ requeues the
//     message, since RabbitMQ would otherwise hand it straight back;
//   - the dial and handshake are bounded by DialTimeout (30 s in amqp091).
//
// Each side owns its connection; a dropped connection is redialled with
// Watermill's exponential backoff.
func newAMQP(cfg Config, ep endpoint, logger watermill.LoggerAdapter) (*Backend, error) {
	amqpConfig := func() amqp.Config {
		c := amqp.NewDurablePubSubConfig(ep.url, amqp.GenerateQueueNameTopicNameWithSuffix(cfg.Group))
		props := amqp091.NewConnectionProperties()
		props.SetClientConnectionName(cfg.Consumer)
		c.Connection.AmqpConfig = &amqp091.Config{
			Dial:       amqp091.DefaultDial(cfg.DialTimeout),
			Properties: props,
			Locale:     "en_US",
		}
		c.Connection.Reconnect = amqp.DefaultReconnectConfig()
		c.Publish.ConfirmDelivery = true
		c.Consume.Qos.PrefetchCount = cfg.AMQP.Prefetch
		return c
	}

	pubConfig := amqpConfig()
	pub, err := amqp.NewPublisher(pubConfig, logger)
	if err != nil {
		return nil, unreachable(AMQP, ep.addrs, cfg.DialTimeout, err)
	}
	sub, err := amqp.NewSubscriber(amqpConfig(), logger)
	if err != nil {
		return nil, errors.Join(unreachable(AMQP, ep.addrs, cfg.DialTimeout, err), pub.Close())
	}
	return &Backend{
		Publisher: ensuringPublisher{Publisher: pub, ensure: (&amqpQueues{
			pub:      pub,
			config:   pubConfig,
			groups:   cfg.AMQP.PublishGroups,
			logger:   logger,
			declared: newTopicSet[struct{}](),
		}).ensure},
		Subscriber: newNackDelaySubscriber(sub, cfg.NackResendSleep),
	}, nil
}

// amqpQueues declares the queues of the configured groups before the first
// publish to each topic, so that messages published before any subscriber
// started wait in the groups' queues instead of being dropped by the
// exchange.
type amqpQueues struct {
	pub      *amqp.Publisher
	config   amqp.Config
	groups   []string
	logger   watermill.LoggerAdapter
	declared *topicSet[struct{}]
}

// ensure declares the topic's exchange and the groups' queues once per
// process.
func (q *amqpQueues) ensure(topic string) error {
	_, err := q.declared.ensure(topic, func(topic string) (struct{}, error) { return struct{}{}, q.declare(topic) })
	return err
}

func (q *amqpQueues) declare(topic string) (err error) {
	if len(q.groups) == 0 {
		return nil
	}
	if !q.pub.IsConnected() {
		return errors.New("backends: amqp: not connected")
	}
	ch, err := q.pub.Connection().Channel()
	if err != nil {
		return fmt.Errorf("backends: amqp: open channel: %w", err)
	}
	defer func() {
		if cerr := ch.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("backends: amqp: close channel: %w", cerr)
		}
	}()
	for _, group := range q.groups {
		params := amqp.BuildTopologyParams{
			Topic:        topic,
			QueueName:    amqp.GenerateQueueNameTopicNameWithSuffix(group)(topic),
			ExchangeName: q.config.Exchange.GenerateName(topic),
			RoutingKey:   q.config.QueueBind.GenerateRoutingKey(topic),
		}
		if err := q.config.TopologyBuilder.BuildTopology(ch, params, q.config, q.logger); err != nil {
			return fmt.Errorf("backends: amqp: declare queue %q: %w", params.QueueName, err)
		}
	}
	return nil
}
