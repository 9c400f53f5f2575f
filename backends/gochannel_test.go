package backends_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
)

// Tests of the defaults of the built-in gochannel backend.

// gochannel is one shared, persistent instance: a subscriber that comes late
// still gets what was published.
func TestGoChannel_SharedPersistent(t *testing.T) {
	t.Parallel()
	b := backendtest.NewBackend(t, backends.Config{URL: "gochannel://"})
	backendtest.Publish(t, b.Publisher, "orders", "early")
	msgs := backendtest.Subscribe(t, b, "orders")
	assert.Equal(t, "early", backendtest.Receive(t, msgs))
}

// A nack on gochannel (and AMQP) is held for NackResendSleep instead of
// spinning.
func TestGoChannel_NackIsDelayed(t *testing.T) {
	t.Parallel()
	b := backendtest.NewBackend(t, backends.Config{URL: "gochannel://", NackResendSleep: 300 * time.Millisecond})
	msgs := backendtest.Subscribe(t, b, "orders")
	backendtest.Publish(t, b.Publisher, "orders", "x")
	m := <-msgs
	m.Nack()
	backendtest.NothingFor(t, msgs, 100*time.Millisecond)
	assert.Equal(t, "x", backendtest.Receive(t, msgs))
}
