package testserver

import (
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// NATSServer is a private nats-server with JetStream, storing in a
// directory of its own, so that it keeps its streams across a restart.
type NATSServer struct {
	// URL is the server's client URL.
	URL string

	port int
	dir  string
	args []string
	proc *process
	life lifecycle
}

// StartNATS starts a private nats-server with JetStream on a free loopback
// port (nats-server must be on PATH), with extraArgs appended to its
// command line, and stops it when the test ends.
func StartNATS(t testing.TB, extraArgs ...string) *NATSServer {
	t.Helper()
	if testing.Short() {
		t.Skip("test with a private nats-server left out by -short")
	}
	port := FreePort(t)
	s := &NATSServer{port: port, dir: t.TempDir(), URL: "nats://127.0.0.1:" + strconv.Itoa(port), args: extraArgs}
	s.life = lifecycle{t: t, up: s.up, down: s.down}
	if err := s.life.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.life.stop)
	return s
}

// up starts nats-server on the server's port and store and waits until it
// listens; when it does not, up stops it again.
func (s *NATSServer) up() error {
	bin, err := lookPath("nats-server")
	if err != nil {
		return err
	}
	logFile := filepath.Join(s.dir, "nats.log")
	p, err := processSpec{
		what: fmt.Sprintf("nats-server on port %d", s.port),
		bin:  bin,
		args: append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", filepath.Join(s.dir, "store"), "-l", logFile},
			s.args...),
		log: logFile,
	}.start()
	if err != nil {
		return err
	}
	if err := p.listening("127.0.0.1:"+strconv.Itoa(s.port), 10*time.Second); err != nil {
		p.stop(syscall.SIGTERM, natsStopGrace)
		return err
	}
	s.proc = p
	return nil
}

// natsStopGrace is how long down waits for nats-server to exit after
// SIGTERM before it kills it.
const natsStopGrace = 10 * time.Second

// down ends the server as an orderly shutdown does (SIGTERM), so that
// JetStream writes what it holds, and waits for it to exit.
func (s *NATSServer) down() {
	s.proc.stop(syscall.SIGTERM, natsStopGrace)
	s.proc = nil
}

// Restart stops the server and starts it again on the same port and store.
// It reports a failure with t.Error, so it may run on any goroutine.
func (s *NATSServer) Restart() { s.RestartAfter(0) }

// RestartAfter is Restart with the server down for d.
func (s *NATSServer) RestartAfter(d time.Duration) { s.life.restartAfter(d) }
