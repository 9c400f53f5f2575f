package amqpbackend

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// amqpMarshaler is watermill-amqp's DefaultMarshaler, but a header that is
// not a string (x-death, say) becomes its %v text: DefaultMarshaler's
// refusal was requeued at once, in an endless loop. It refuses the zero
// Delivery of a cancelled consumer.
type amqpMarshaler struct{ amqp.DefaultMarshaler }

var _ amqp.Marshaler = amqpMarshaler{}

func (m amqpMarshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		// Read from a channel closed when the queue was deleted: the error
		// makes watermill-amqp subscribe again, declaring the queue.
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
