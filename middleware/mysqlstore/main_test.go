package mysqlstore_test

import (
	"os"
	"testing"
)

// TestMain runs the kill test's consumer instead of the tests when this
// binary was re-executed as one (see killChild).
func TestMain(m *testing.M) {
	if kind := os.Getenv(killStoreVar); kind != "" {
		os.Exit(killChild(kind))
	}
	os.Exit(m.Run())
}
