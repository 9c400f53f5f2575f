package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/examples/internal/readmetest"
)

// TestDocsShowThisHandler keeps the MySQL handler in docs/GUARANTEES.md, in the
// section "Exactly-once database effects", a verbatim excerpt of this
// program, which CI compiles and kills.
func TestDocsShowThisHandler(t *testing.T) {
	block := readmetest.RequireQuotedIn(t, "../..", "docs/GUARANTEES.md", "excerpt", "examples/mysql-ledger/main.go")
	require.Contains(t, block, "store.CompleteInTx(ctx, tx)")
}
