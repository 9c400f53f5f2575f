package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// storeKey returns the key under which msg's state is stored:
// prefix:scope:key. The key comes from Config.KeyFunc, else the first
// non-empty Config.KeyMetadata field, else the message UUID; an empty key is
// ErrMissingKey. A key longer than Config.MaxKeyLength becomes
// "sha256:<hex>", and so does a key that starts with "sha256:". Colons and
// percent signs in the scope are escaped (%3A, %25) so that no scope and key
// pair can collide with another.
func (d *Middleware) storeKey(msg *message.Message, scope string) (string, error) {
	key, err := d.messageKey(msg)
	if err != nil {
		return "", err
	}
	// A literal key that looks like a hashed one is hashed too, so it can
	// never take the place of a long key's hash.
	if len(key) > d.cfg.MaxKeyLength || strings.HasPrefix(key, hashedKeyPrefix) {
		sum := sha256.Sum256([]byte(key))
		key = hashedKeyPrefix + hex.EncodeToString(sum[:])
	}
	return d.cfg.KeyPrefix + ":" + scopeEscaper.Replace(scope) + ":" + key, nil
}

const hashedKeyPrefix = "sha256:"

var scopeEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

func (d *Middleware) messageKey(msg *message.Message) (string, error) {
	if d.cfg.KeyFunc != nil {
		key, err := d.cfg.KeyFunc(msg)
		if err != nil {
			return "", fmt.Errorf("%w: key function of message %s: %w", ErrMissingKey, msg.UUID, err)
		}
		if key == "" {
			return "", fmt.Errorf("%w: key function returned an empty key for message %s", ErrMissingKey, msg.UUID)
		}
		return key, nil
	}
	for _, field := range d.cfg.KeyMetadata {
		if v := msg.Metadata.Get(field); v != "" {
			return v, nil
		}
	}
	if msg.UUID != "" {
		return msg.UUID, nil
	}
	return "", fmt.Errorf("%w: no %s metadata and no UUID", ErrMissingKey, strings.Join(d.cfg.KeyMetadata, " or "))
}
