package backends

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// MetadataUndecodable is the metadata key set on a message whose broker
// record could not be decoded in full; its value says what was left out. The
// message is handed to the handler anyway (with what could be read), never
// dropped and never redelivered in a loop that no handler sees, so that the
// handler, the idempotency middleware or a PoisonQueue decides its fate.
// Only the Redis Streams backend sets it, for an entry whose metadata field
// is not the msgpack map Watermill writes.
const MetadataUndecodable = "_backends_undecodable"

// redisUnmarshaller reads a stream entry as watermill-redisstream's
// DefaultMarshallerUnmarshaller does, but never fails. The library stops
// reading the stream, for good and with one log line, at the first entry it
// cannot unmarshal (an entry another program added without a UUID field,
// metadata that is not msgpack): every message after it waited
// unconsumed. Here an entry without a UUID is handed on with an empty UUID
// (the idempotency middleware then keys it by its requestId, or returns
// ErrMissingKey, a permanent error for PoisonQueue), and undecodable
// metadata is replaced by MetadataUndecodable.
type redisUnmarshaller struct{}

var _ redisstream.Unmarshaller = redisUnmarshaller{}

func (redisUnmarshaller) Unmarshal(values map[string]any) (*message.Message, error) {
	// go-redis hands every field over as a string, which the library's
	// unmarshaller asserts; anything else is read here.
	for _, k := range []string{redisstream.UUIDHeaderKey, "payload", "metadata"} {
		if _, ok := values[k].(string); !ok && values[k] != nil {
			return redisFallback(values, fmt.Errorf("field %s is a %T", k, values[k])), nil
		}
	}
	if values[redisstream.UUIDHeaderKey] == nil {
		return redisFallback(values, nil), nil
	}
	msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(values)
	if err != nil {
		return redisFallback(values, err), nil
	}
	return msg, nil
}

// redisFallback is the entry's UUID and payload as text, with the metadata
// replaced by MetadataUndecodable when err says it could not be read.
func redisFallback(values map[string]any, err error) *message.Message {
	msg := message.NewMessage(redisString(values[redisstream.UUIDHeaderKey]), []byte(redisString(values["payload"])))
	if err != nil {
		msg.Metadata.Set(MetadataUndecodable, "metadata: "+err.Error())
	} else if md := redisString(values["metadata"]); md != "" {
		// No UUID: the library rejects the entry before it reads the
		// metadata; read it the same way.
		m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(map[string]any{
			redisstream.UUIDHeaderKey: "", "metadata": md,
		})
		if err != nil {
			msg.Metadata.Set(MetadataUndecodable, "metadata: "+err.Error())
		} else {
			msg.Metadata = m.Metadata
		}
	}
	return msg
}

// redisString is a stream entry's field as text; go-redis returns strings.
func redisString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

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
