package idempotency_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// TestDeprecatedIdempotency: code written against the former name of
// Middleware still compiles, and what New returns to it behaves as a
// Middleware: three copies of one key run the handler once, and the two
// later ones are duplicates. (staticcheck's SA1019 does not report the
// uses of deprecated names in the tests of the package that declares them,
// so these need no lint:ignore.)
func TestDeprecatedIdempotency(t *testing.T) {
	obs := newOutcomes()
	var idem *idempotency.Idempotency
	idem, err := idempotency.New(idempotency.Config{Store: memstore.New(memstore.Config{}), Observer: obs}, watermill.NopLogger{})
	require.NoError(t, err)
	var asNew *idempotency.Middleware = idem // one type under two names
	var c counter
	h := asNew.Middleware(c.handle)
	for range 3 {
		_, err := h(newMsg("order-1", "42 EUR"))
		require.NoError(t, err)
	}
	assert.EqualValues(t, 1, c.runs.Load())
	assert.Equal(t, 1, obs.get(idempotency.OutcomeProcessed))
	assert.Equal(t, 2, obs.get(idempotency.OutcomeDuplicate))
}
