package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

func TestOnceExample(t *testing.T) {
	for _, tc := range []struct{ name, redis string }{
		{"memstore", ""},
		{"redis", testserver.RedisAddr(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			require.NoError(t, run(&out, tc.redis))
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			assert.Equal(t, fmt.Sprintf("OK: %d of %d invoices sent exactly once", customers, customers), lines[len(lines)-1])
			// Every worker sees every customer: one sends, the others get
			// the stored receipt back.
			assert.Contains(t, lines[0], fmt.Sprintf("%d results replayed", customers*(workers-1)))
		})
	}
}
