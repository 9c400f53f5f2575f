package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/examples/internal/readmetest"
)

// TestREADMEShowsThisHandler keeps the README's MySQL handler, in the
// section "Exactly-once database effects", a verbatim excerpt of this
// program, which CI compiles and kills.
func TestREADMEShowsThisHandler(t *testing.T) {
	block := readmetest.RequireQuoted(t, "../..", "excerpt", "examples/mysql-ledger/main.go")
	require.Contains(t, block, "store.CompleteInTx(ctx, tx)")
}
