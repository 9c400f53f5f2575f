package idempotency

import (
	"cmp"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// MaxTTL is the longest lease or TTL a config accepts: 100 years. A TTL has
// no "no expiry" value. A store given a longer TTL holds the key for MaxTTL.
const MaxTTL = configerr.MaxTTL

// The defaults of Config, applied in one place (setDefaults).
const (
	defaultKeyPrefix = "idem"
	defaultNackDelay = time.Second
)

// Config configures the Watermill middleware: what it adds to the [Once]
// it runs on. A nil *Config means the defaults.
type Config struct {
	// KeyFunc returns a message's key. An empty key or an error is
	// [ErrMissingKey]. The default reads the metadata "requestId", then
	// "Idempotency-Key", else takes the message UUID.
	KeyFunc func(msg *message.Message) (string, error)
	// Scope returns a message's scope, the middle of its stored key
	// (prefix:scope:key). The default is the handler's name.
	Scope func(msg *message.Message) string
	// KeyPrefix starts every stored key; it must not hold a colon. The
	// default is "idem".
	KeyPrefix string
	// NackDelay is the wait before a nack of a key in progress or a store
	// that is down. A negative value means none. The default is 1 s.
	NackDelay time.Duration
	// CheckPayload stores the payload's SHA-256 with the key; the same key
	// with another payload is then [ErrKeyReused]. The default is off.
	CheckPayload bool
	// DisableOutputReplay stores no output: a duplicate is acked without
	// republishing it. The default stores and replays the output.
	DisableOutputReplay bool
}

// setDefaults fills the zero fields of c.
func (c *Config) setDefaults() {
	if c.Scope == nil {
		c.Scope = func(msg *message.Message) string { return message.HandlerNameFromCtx(msg.Context()) }
	}
	c.KeyPrefix = cmp.Or(c.KeyPrefix, defaultKeyPrefix)
	c.NackDelay = cmp.Or(c.NackDelay, defaultNackDelay)
}
