package idempotency

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// storeKey returns the key under which msg's state is stored:
// prefix:scope:key, built as every adapter builds it (adapter.StoreKey):
// the scope escaped, a key longer than 200 bytes hashed.
func (d *Middleware) storeKey(msg *message.Message, scope string) (string, error) {
	if d.cfg.KeyFunc == nil {
		key := defaultKey(msg)
		if key == "" {
			return "", fmt.Errorf("%w: no requestId or Idempotency-Key metadata and no UUID", ErrMissingKey)
		}
		return adapter.StoreKey(d.cfg.KeyPrefix, scope, key, false), nil
	}
	key, err := d.cfg.KeyFunc(msg)
	if err != nil {
		return "", fmt.Errorf("%w: key function of message %s: %w", ErrMissingKey, msg.UUID, err)
	}
	if key == "" {
		return "", fmt.Errorf("%w: key function returned an empty key for message %s", ErrMissingKey, msg.UUID)
	}
	return adapter.StoreKey(d.cfg.KeyPrefix, scope, key, false), nil
}

// defaultKey is the key when Config.KeyFunc is nil: the metadata
// "requestId", then "Idempotency-Key", else the message UUID.
func defaultKey(msg *message.Message) string {
	if v := msg.Metadata.Get("requestId"); v != "" {
		return v
	}
	if v := msg.Metadata.Get("Idempotency-Key"); v != "" {
		return v
	}
	return msg.UUID
}
