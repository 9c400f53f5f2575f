package testserver

import (
	"bufio"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RestartCommand returns a shell command that runs restart in this test
// process and exits when it has returned, for Watermill's
// tests.Features.RestartServiceCommand: the suite runs that command (with
// exec) to restart the broker, and a private broker belongs to the test
// process. The command talks to the test through named pipes (one in a
// temporary directory of the test's, one of its own for the answer);
// restarts asked for at the same time run one after the other. restart runs on a goroutine of its own: it must report
// failures with t.Error, not t.Fatal.
func RestartCommand(t testing.TB, restart func()) []string {
	t.Helper()
	req := filepath.Join(t.TempDir(), "restart")
	if err := syscall.Mkfifo(req, 0o600); err != nil {
		t.Fatalf("restart command: mkfifo: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			f, err := os.OpenFile(req, os.O_RDONLY, 0) // waits for a writer
			if err != nil {
				return
			}
			// Each line is a request: the path of the named pipe on which
			// its command waits for the answer; "stop" ends the loop.
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if sc.Text() == "stop" {
					_ = f.Close()
					return
				}
				restart()
				if d, err := os.OpenFile(sc.Text(), os.O_WRONLY, 0); err == nil { // waits for the command's read
					_, _ = d.Write([]byte("done\n"))
					_ = d.Close()
				}
			}
			_ = f.Close()
		}
	}()
	t.Cleanup(func() {
		if f, err := os.OpenFile(req, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_, _ = f.Write([]byte("stop\n"))
			_ = f.Close()
			wg.Wait()
		}
	})
	const script = `d=$(mktemp -u) && mkfifo "$d" || exit 1
echo "$d" > "$0" && read -r _ < "$d"
status=$?
rm -f "$d"
exit $status`
	return []string{"sh", "-c", script, req}
}

// lifecycle is the start and stop of a private broker that restarts in
// this process (NATSServer, KafkaCluster) on the same ports and data, so
// that restarting it disturbs no other test. Starts and stops run one at a
// time; starting a running broker and stopping a stopped one do nothing.
type lifecycle struct {
	t    testing.TB
	up   func() error // starts the broker; when it fails, nothing runs
	down func()       // stops the running broker

	mu      sync.Mutex
	running bool
}

// start starts the broker unless it runs.
func (l *lifecycle) start() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running {
		return nil
	}
	if err := l.up(); err != nil {
		return err
	}
	l.running = true
	return nil
}

// stop stops the broker if it runs.
func (l *lifecycle) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running {
		l.down()
		l.running = false
	}
}

// restartAfter stops the broker, waits d and starts it again, reporting a
// failed start with t.Error, so that it may run on any goroutine.
func (l *lifecycle) restartAfter(d time.Duration) {
	l.stop()
	time.Sleep(d)
	if err := l.start(); err != nil {
		l.t.Error(err)
	}
}
