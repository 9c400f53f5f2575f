package inprocess_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestMarkedStores: memstore is marked, a wrapper that embeds it is, and a
// wrapper that keeps it behind the Store interface is not.
func TestMarkedStores(t *testing.T) {
	t.Parallel()
	mem := memstore.New(nil)
	type embedding struct{ *memstore.Store }
	type wrapping struct{ idempotency.Store }

	assert.True(t, inprocess.Is(mem))
	assert.True(t, inprocess.Is(embedding{mem}))
	assert.False(t, inprocess.Is(wrapping{mem}))
	assert.False(t, inprocess.Is(nil))
	assert.False(t, inprocess.Is(struct{}{}))
}
