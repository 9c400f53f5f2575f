package natsbackend_test

import (
	"testing"

	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// This test binary links natsbackend alone: a URL of another broker is
// refused with the import to add.
func TestBrokersNotLinked(t *testing.T) { backendtest.NotLinked(t, brokerkit.NATS) }
