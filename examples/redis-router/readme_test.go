package main

import (
	"testing"

	"github.com/idempotency/watermill-idempotency/examples/internal/readmetest"
)

// TestREADMEShowsThisProgram keeps the README's example identical to this
// program, which CI compiles.
func TestREADMEShowsThisProgram(t *testing.T) {
	readmetest.RequireQuoted(t, "../..", "example", "examples/redis-router/main.go")
}
