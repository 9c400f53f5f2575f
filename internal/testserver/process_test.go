package testserver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProcessStopKillsAfterGrace: a server that ignores the stop signal is
// killed once the grace period is over.
func TestProcessStopKillsAfterGrace(t *testing.T) {
	t.Parallel()
	log := filepath.Join(t.TempDir(), "out")
	// The shell, and the sleep it starts, ignore SIGTERM; "up" says so.
	p, err := processSpec{what: "stubborn", bin: "sh", args: []string{"-c", `trap "" TERM; echo up; sleep 30`}, log: log, logOutput: true, ownGroup: true}.start()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out, _ := os.ReadFile(log)
		return strings.Contains(string(out), "up")
	}, 5*time.Second, 10*time.Millisecond)
	start := time.Now()
	p.stop(syscall.SIGTERM, 300*time.Millisecond)
	elapsed := time.Since(start)
	assert.GreaterOrEqual(t, elapsed, 300*time.Millisecond, "waited out the grace period")
	assert.Less(t, elapsed, 10*time.Second, "killed, not left to end by itself")
	select {
	case <-p.exited:
	default:
		t.Fatal("stop returned before the process exited")
	}
}

// TestProcessListeningFails: a server that never listens fails with its
// name and its log.
func TestProcessListeningFails(t *testing.T) {
	t.Parallel()
	log := filepath.Join(t.TempDir(), "out")
	p, err := processSpec{what: "mute server", bin: "sh", args: []string{"-c", "echo the reason; exec sleep 30"}, log: log, logOutput: true}.start()
	require.NoError(t, err)
	t.Cleanup(p.kill)
	err = p.listening("127.0.0.1:"+strconv.Itoa(FreePort(t)), 300*time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mute server did not start")
	assert.Contains(t, err.Error(), "the reason")
}
