package pgstore_test

import (
	"os"
	"testing"

	"github.com/idempotency/watermill-idempotency/middleware/internal/killtest"
)

// TestMain runs the kill test's consumer instead of the tests when this
// binary was re-executed as one (see killChild).
func TestMain(m *testing.M) {
	if c, ok := killtest.ConsumerFromEnv(); ok {
		os.Exit(killChild(c))
	}
	os.Exit(m.Run())
}
