package brokeradmin

import (
	"errors"

	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// JetStream connects to the NATS server at url and returns a JetStream
// context on that connection, and a function that closes it.
func JetStream(url string) (nats.JetStreamContext, func(), error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := nc.JetStream()
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// DeleteNATSStreams deletes the JetStream stream that captures each topic,
// and with it the stream's durable consumers. A topic that no stream
// captures is skipped.
func DeleteNATSStreams(url string, topics ...string) error {
	js, closeConn, err := JetStream(url)
	if err != nil {
		return err
	}
	defer closeConn()
	var errs []error
	for _, topic := range topics {
		stream, err := js.StreamNameBySubject(topic)
		if errors.Is(err, nats.ErrNoMatchingStream) {
			continue
		}
		if err == nil {
			err = js.DeleteStream(stream)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DeleteAMQP deletes the queue topic_group of each topic and group, then
// the topic's exchange. A failed operation closes its channel in RabbitMQ,
// so the next one opens another.
func DeleteAMQP(url string, topics, groups []string) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	var ch *amqp091.Channel
	var errs []error
	do := func(op func(ch *amqp091.Channel) error) {
		if ch == nil {
			if ch, err = conn.Channel(); err != nil {
				errs = append(errs, err)
				return
			}
		}
		if err := op(ch); err != nil {
			errs = append(errs, err)
			ch = nil
		}
	}
	seen := map[string]bool{}
	for _, topic := range topics {
		for _, g := range groups {
			if q := topic + "_" + g; !seen[q] {
				seen[q] = true
				do(func(ch *amqp091.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
			}
		}
		do(func(ch *amqp091.Channel) error { return ch.ExchangeDelete(topic, false, false) })
	}
	if ch != nil {
		_ = ch.Close()
	}
	return errors.Join(errs...)
}
