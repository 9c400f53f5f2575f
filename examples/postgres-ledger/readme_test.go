package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEShowsThisHandler keeps the README's handler, in the section
// "Exactly-once database effects", a verbatim excerpt of this program, which
// CI compiles and kills.
func TestREADMEShowsThisHandler(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	_, after, found := strings.Cut(string(readme), "<!-- excerpt: examples/postgres-ledger/main.go -->\n```go\n")
	require.True(t, found, "README has no excerpt block for examples/postgres-ledger/main.go")
	block, _, found := strings.Cut(after, "```\n")
	require.True(t, found)
	require.Contains(t, block, "store.CompleteInTx(ctx, tx)")
	require.True(t, strings.Contains(string(src), block), "the README's excerpt is not in main.go as it stands:\n%s", block)
}
