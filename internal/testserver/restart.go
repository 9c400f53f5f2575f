package testserver

import (
	"bufio"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
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
