package redisbackend

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// redisUnmarshaller is watermill-redisstream's DefaultMarshallerUnmarshaller,
// but never fails, where the library stopped reading the stream for good:
// an entry without a UUID is handed on with an empty one, and undecodable
// metadata becomes brokerkit.MetadataUndecodable.
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
// replaced by brokerkit.MetadataUndecodable when err says it could not be read.
func redisFallback(values map[string]any, err error) *message.Message {
	msg := message.NewMessage(redisString(values[redisstream.UUIDHeaderKey]), []byte(redisString(values["payload"])))
	if err != nil {
		msg.Metadata.Set(brokerkit.MetadataUndecodable, "metadata: "+err.Error())
	} else if md := redisString(values["metadata"]); md != "" {
		// No UUID: the library rejects the entry before it reads the
		// metadata; read it the same way.
		m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(map[string]any{
			redisstream.UUIDHeaderKey: "", "metadata": md,
		})
		if err != nil {
			msg.Metadata.Set(brokerkit.MetadataUndecodable, "metadata: "+err.Error())
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
