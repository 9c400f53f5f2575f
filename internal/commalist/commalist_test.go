package commalist_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/internal/commalist"
)

func TestSplit(t *testing.T) {
	for in, want := range map[string][]string{
		"":                  nil,
		" , ,":              nil,
		"redis":             {"redis"},
		" a, b ,,c ":        {"a", "b", "c"},
		"one two,\tthree\n": {"one two", "three"},
	} {
		assert.Equal(t, want, commalist.Split(in), "%q", in)
	}
}
