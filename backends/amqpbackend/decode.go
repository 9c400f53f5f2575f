package amqpbackend

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// amqpMarshaler marshals as watermill-amqp's DefaultMarshaler and
// unmarshals as it does, but never fails. DefaultMarshaler rejects a
// message with a header that is not a string (a number or a table from
// another producer, or the x-death table RabbitMQ adds to a dead-lettered
// message), and watermill-amqp then nacks it with requeue at once, before
// any handler or nack delay sees it: RabbitMQ hands it straight back, in a
// loop without end. Here such a header becomes its value formatted with
// fmt's %v. It also refuses the zero Delivery that watermill-amqp reads
// from a closed deliveries channel when its consumer was cancelled.
type amqpMarshaler struct{ amqp.DefaultMarshaler }

var _ amqp.Marshaler = amqpMarshaler{}

func (m amqpMarshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		// Not a delivery: watermill-amqp reads its deliveries channel
		// without checking that it is open, and amqp091 closes it when
		// RabbitMQ cancels the consumer (its queue was deleted). The zero
		// Delivery would reach the handler as an empty message; the error
		// makes watermill-amqp subscribe again instead, declaring the
		// queue anew.
		return nil, errors.New("backends: amqp: the consumer was cancelled (its queue deleted?); subscribing again")
	}
	uuidKey := m.MessageUUIDHeaderKey
	if uuidKey == "" {
		uuidKey = amqp.DefaultMessageUUIDHeaderKey
	}
	var uuid string
	if v, ok := d.Headers[uuidKey]; ok {
		uuid = amqpHeader(v)
	}
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers))
	for k, v := range d.Headers {
		if k != uuidKey {
			msg.Metadata[k] = amqpHeader(v)
		}
	}
	return msg, nil
}

func amqpHeader(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprintf("%v", v)
}
