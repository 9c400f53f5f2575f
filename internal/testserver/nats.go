package testserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"

	"github.com/nats-io/nats.go"
)

// NATSURL returns the shared NATS server's URL (NATS_URL, default
// nats://127.0.0.1:4222), failing the test when it does not answer. The server
// must run with JetStream enabled. Tests must isolate themselves with unique
// subjects, streams and durable names: the server is shared.
// DeleteNATSStreams removes what a test created.
func NATSURL(t testing.TB) string {
	t.Helper()
	return serviceURL(t, "NATS", "NATS_URL", "nats://127.0.0.1:4222", "4222")
}

// DeleteNATSStreams deletes the JetStream stream that captures each topic,
// and with it the stream's durable consumers (brokeradmin.DeleteNATSStreams).
// Failures are logged, not fatal: it is cleanup.
func DeleteNATSStreams(t testing.TB, url string, topics ...string) {
	if err := brokeradmin.DeleteNATSStreams(url, topics...); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

// WithJetStream runs f on a JetStream context of the NATS server at url,
// on a connection of its own, for cleanup: when connecting fails, it logs
// why and does not run f.
func WithJetStream(t testing.TB, url string, f func(js nats.JetStreamContext)) {
	js, closeConn, err := brokeradmin.JetStream(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer closeConn()
	f(js)
}

// NATSServer is a private nats-server with JetStream, storing in a
// directory of its own, so that it keeps its streams across a restart.
type NATSServer struct {
	// URL is the server's client URL.
	URL string

	port int
	dir  string
	cmd  *exec.Cmd
	life lifecycle
}

// StartNATS starts a private nats-server with JetStream on a free loopback
// port (nats-server must be on PATH) and stops it when the test ends.
func StartNATS(t testing.TB) *NATSServer {
	t.Helper()
	if testing.Short() {
		t.Skip("test with a private nats-server left out by -short")
	}
	port := FreePort(t)
	s := &NATSServer{port: port, dir: t.TempDir(), URL: "nats://127.0.0.1:" + strconv.Itoa(port)}
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
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		return fmt.Errorf("nats-server is required on PATH: %w", err)
	}
	logFile := filepath.Join(s.dir, "nats.log")
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", filepath.Join(s.dir, "store"), "-l", logFile)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start nats-server: %w", err)
	}
	s.cmd = cmd
	if err := waitPort("127.0.0.1:"+strconv.Itoa(s.port), 10*time.Second); err != nil {
		s.down()
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("nats-server on port %d did not start: %w\n%s", s.port, err, log)
	}
	return nil
}

// down ends the server as an orderly shutdown does (SIGTERM), so that
// JetStream writes what it holds, and waits for it to exit.
func (s *NATSServer) down() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// Restart stops the server and starts it again on the same port and store.
// It reports a failure with t.Error, so it may run on any goroutine.
func (s *NATSServer) Restart() { s.RestartAfter(0) }

// RestartAfter is Restart with the server down for d.
func (s *NATSServer) RestartAfter(d time.Duration) { s.life.restartAfter(d) }
