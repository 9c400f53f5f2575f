package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	assert.Equal(t, fmt.Sprintf("OK: %d of %d unique orders charged exactly once", orders, orders), lines[len(lines)-1])
	assert.Contains(t, out.String(), fmt.Sprintf("processed          %d", orders))
	assert.Contains(t, out.String(), fmt.Sprintf("duplicate          %d", orders*(copies-1)))
	assert.Contains(t, out.String(), "handler_failed")
}
