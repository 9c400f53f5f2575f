package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEShowsThisProgram keeps the README's example identical to this
// program, which CI compiles.
func TestREADMEShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	_, after, found := strings.Cut(string(readme), "<!-- example: examples/redis-router/main.go -->\n```go\n")
	require.True(t, found, "README has no example block for examples/redis-router/main.go")
	block, _, found := strings.Cut(after, "```\n")
	require.True(t, found)
	require.Equal(t, string(src), block)
}
