package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// processSpec is how to run the binary of a private server (redis-server,
// a sentinel, nats-server, a RabbitMQ node) as a child process.
type processSpec struct {
	// what names the server in errors: "nats-server on port 4222".
	what string
	bin  string
	args []string
	// env is the server's environment; nil means the test's.
	env []string
	// log is the file the server logs to, shown when it does not start.
	log string
	// logOutput sends the server's stdout and stderr to log, for a server
	// that does not write a log file itself; otherwise they are discarded.
	logOutput bool
	// ownGroup runs the server in a process group of its own, so that a
	// stray signal to the test does not reach it; kill kills the group.
	ownGroup bool
}

// process is a running private server started by processSpec.start.
type process struct {
	spec   processSpec
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited
}

// lookPath finds the binary name on PATH.
func lookPath(name string) (string, error) {
	bin, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is required on PATH: %w", name, err)
	}
	return bin, nil
}

// start starts the server; it does not wait until it is ready (listening).
func (s processSpec) start() (*process, error) {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = s.env
	if s.ownGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	var out *os.File
	if s.logOutput {
		var err error
		if out, err = os.Create(s.log); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		if out != nil {
			_ = out.Close()
		}
		return nil, fmt.Errorf("start %s: %w", s.what, err)
	}
	p := &process{spec: s, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		if out != nil {
			_ = out.Close()
		}
		close(p.exited)
	}()
	return p, nil
}

// listening waits until addr accepts TCP connections; when it does not
// within timeout, it returns failed's error.
func (p *process) listening(addr string, timeout time.Duration) error {
	if err := waitPort(addr, timeout); err != nil {
		return p.failed(err)
	}
	return nil
}

// failed returns an error saying that the server did not start because of
// err, with the server's log.
func (p *process) failed(err error) error {
	log, _ := os.ReadFile(p.spec.log)
	return fmt.Errorf("%s did not start: %w\n%s", p.spec.what, err, log)
}

// stop sends the server sig (SIGTERM for an orderly shutdown) and waits
// for it to exit, killing it when it has not after grace.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	p.signal(sig)
	p.waitExit(grace)
}

// waitExit waits for the server to exit, once it has been asked to, and
// kills it when it has not after grace.
func (p *process) waitExit(grace time.Duration) {
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.kill()
	}
}

// kill kills the server (SIGKILL, as a crash would) and waits for it to
// exit.
func (p *process) kill() {
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// signal sends sig to the server, or to its process group.
func (p *process) signal(sig syscall.Signal) {
	if p.spec.ownGroup {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
		return
	}
	_ = p.cmd.Process.Signal(sig)
}
