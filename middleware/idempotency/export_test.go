package idempotency

import "github.com/ThreeDotsLabs/watermill/message"

// Config returns the configuration in force, defaults filled, for the tests
// of the defaults.
func (d *Middleware) Config() Config { return d.cfg }

// StoreKey returns the key under which msg's state is stored, for the tests
// that look at records.
func (d *Middleware) StoreKey(msg *message.Message) (string, error) {
	return d.storeKey(msg, d.cfg.Scope(msg))
}
