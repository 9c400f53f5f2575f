package brokeradmin

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency/watermill-idempotency/internal/amqpname"
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
		return fmt.Errorf("brokeradmin: connect to NATS: %w", err)
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
		if err != nil {
			errs = append(errs, fmt.Errorf("brokeradmin: delete the stream of %s: %w", topic, err))
		}
	}
	return errors.Join(errs...)
}

// DeleteAMQP deletes the queue of each topic and group, then the topic's
// exchange, named as package amqpname names them. A failed operation closes
// its channel in RabbitMQ, so the next one opens another; when no channel
// opens, it stops there.
func DeleteAMQP(url string, topics, groups []string) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return fmt.Errorf("brokeradmin: connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	var ch *amqp091.Channel
	var errs []error
	// do runs op on a channel, opening one when the last op closed it; it
	// returns false when no channel opens.
	do := func(what string, op func(ch *amqp091.Channel) error) bool {
		if ch == nil {
			var err error
			if ch, err = conn.Channel(); err != nil {
				errs = append(errs, fmt.Errorf("brokeradmin: open a channel: %w", err))
				return false
			}
		}
		if err := op(ch); err != nil {
			errs = append(errs, fmt.Errorf("brokeradmin: delete %s: %w", what, err))
			ch = nil
		}
		return true
	}
	seen := map[string]bool{}
deletions:
	for _, topic := range topics {
		for _, g := range groups {
			if q := amqpname.Queue(topic, g); !seen[q] {
				seen[q] = true
				if !do("queue "+q, func(ch *amqp091.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err }) {
					break deletions
				}
			}
		}
		if !do("exchange "+topic, func(ch *amqp091.Channel) error { return ch.ExchangeDelete(amqpname.Exchange(topic), false, false) }) {
			break
		}
	}
	if ch != nil {
		_ = ch.Close()
	}
	return errors.Join(errs...)
}
