package testserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RabbitMQNode is a private RabbitMQ node (a node name, AMQP port,
// distribution port and data directory of its own) beside the shared one,
// which it does not disturb.
type RabbitMQNode struct {
	// URL is the node's AMQP URL (guest/guest).
	URL string

	t    testing.TB
	name string
	env  []string
	dir  string
}

// rabbitmqBin is where the Debian package keeps RabbitMQ's own scripts; the
// wrappers on PATH switch to the rabbitmq user, who cannot write a test's
// temporary directory.
const rabbitmqBin = "/usr/lib/rabbitmq/bin"

// StartRabbitMQ starts a private RabbitMQ node on free loopback ports and
// stops it when the test ends. A node takes seconds to boot.
func StartRabbitMQ(t testing.TB) *RabbitMQNode {
	t.Helper()
	if testing.Short() {
		t.Skip("test with a private RabbitMQ node left out by -short")
	}
	server := filepath.Join(rabbitmqBin, "rabbitmq-server")
	if _, err := os.Stat(server); err != nil {
		t.Fatalf("RabbitMQ is required at %s: %v", rabbitmqBin, err)
	}
	port, dist := FreePort(t), FreePort(t)
	dir := t.TempDir()
	n := &RabbitMQNode{
		t:    t,
		name: fmt.Sprintf("idemtest%d@localhost", port),
		dir:  dir,
		URL:  fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
	}
	conf := fmt.Sprintf("listeners.tcp.1 = 127.0.0.1:%d\nloopback_users = none\n", port)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.env = append(os.Environ(),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "rabbitmq.pid"),
	)
	p, err := processSpec{
		what:      "RabbitMQ node " + n.name,
		bin:       server,
		env:       n.env,
		log:       filepath.Join(dir, "server.out"),
		logOutput: true,
		ownGroup:  true, // a stray signal to the test does not reach it
	}.start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.ctl(30*time.Second, "stop")
		p.waitExit(30 * time.Second)
	})
	// await_startup fails at once while the node has not yet registered
	// with epmd: ask again until it waits and answers.
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := n.ctl(time.Until(deadline), "await_startup")
		if err == nil {
			break
		}
		select {
		case <-p.exited:
			err = errors.New("the node exited")
		default:
			if time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		t.Fatal(p.failed(err))
	}
	if err := p.listening("127.0.0.1:"+strconv.Itoa(port), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return n
}

// ctl runs rabbitmqctl against the node.
func (n *RabbitMQNode) ctl(timeout time.Duration, args ...string) error {
	_, err := n.run(timeout, "rabbitmqctl", args...)
	return err
}

// Command runs one of RabbitMQ's command-line tools (rabbitmqctl,
// rabbitmq-plugins) against the node, as an operator would, and returns
// its standard output.
func (n *RabbitMQNode) Command(tool string, args ...string) (string, error) {
	return n.run(time.Minute, tool, args...)
}

func (n *RabbitMQNode) run(timeout time.Duration, tool string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args = append([]string{"-n", n.name}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(rabbitmqBin, tool), args...)
	cmd.Env = n.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %v: %w\n%s%s", tool, args, err, out, stderr.String())
	}
	return string(out), nil
}

// Restart stops the RabbitMQ application of the node and starts it again
// (rabbitmqctl stop_app, start_app): every connection is closed, the
// listener goes away and comes back, durable queues and persistent messages
// are recovered from disk. It reports a failure with t.Error, so it may
// run on any goroutine.
func (n *RabbitMQNode) Restart() { n.RestartAfter(0) }

// RestartAfter is Restart with the application down for d.
func (n *RabbitMQNode) RestartAfter(d time.Duration) {
	if err := n.ctl(60*time.Second, "stop_app"); err != nil {
		n.t.Error(err)
		return
	}
	time.Sleep(d)
	if err := n.ctl(60*time.Second, "start_app"); err != nil {
		n.t.Error(err)
	}
}
