package testserver_test

import (
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// TestRestartCommand: the command runs the restart in this process and
// returns only once it has returned; commands run together restart one
// after the other.
func TestRestartCommand(t *testing.T) {
	t.Parallel()
	var running, runs, overlaps atomic.Int32
	cmd := testserver.RestartCommand(t, func() {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(50 * time.Millisecond)
		runs.Add(1)
		running.Add(-1)
	})
	require.NoError(t, exec.Command(cmd[0], cmd[1:]...).Run())
	assert.EqualValues(t, 1, runs.Load(), "the command returned after the restart")

	done := make(chan error, 2)
	for range 2 {
		go func() { done <- exec.Command(cmd[0], cmd[1:]...).Run() }()
	}
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	assert.EqualValues(t, 3, runs.Load())
	assert.Zero(t, overlaps.Load(), "restarts asked for together run one after the other")
}
