package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Private brokers that a test starts, restarts and stops, on free loopback
// ports, so that restarting one disturbs no other test. Each keeps its data
// across a restart, as a broker with a disk does.

// NATSServer is a private nats-server with JetStream, storing in a
// directory of its own.
type NATSServer struct {
	// URL is the server's client URL.
	URL string

	t    testing.TB
	port int
	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

// StartNATS starts a private nats-server with JetStream on a free loopback
// port (nats-server must be on PATH) and stops it when the test ends.
func StartNATS(t testing.TB) *NATSServer {
	t.Helper()
	if testing.Short() {
		t.Skip("test with a private nats-server left out by -short")
	}
	port := FreePort(t)
	s := &NATSServer{t: t, port: port, dir: t.TempDir(), URL: "nats://127.0.0.1:" + strconv.Itoa(port)}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

func (s *NATSServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
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
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("nats-server on port %d did not start: %w\n%s", s.port, err, log)
	}
	return nil
}

// stop ends the server as an orderly shutdown does (SIGTERM), so that
// JetStream writes what it holds, and waits for it to exit.
func (s *NATSServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
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
func (s *NATSServer) RestartAfter(d time.Duration) { restartAfter(s.t, d, s.stop, s.start) }

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
	cmd := exec.Command(server)
	cmd.Env = n.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a stray signal to the test does not reach it
	out, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start RabbitMQ node: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = n.ctl(30*time.Second, "stop")
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
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
		case <-exited:
			err = errors.New("the node exited")
		default:
			if time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
				continue
			}
		}
		log, _ := os.ReadFile(filepath.Join(dir, "server.out"))
		t.Fatalf("RabbitMQ node %s did not start: %v\n%s", n.name, err, log)
	}
	if err := waitPort("127.0.0.1:"+strconv.Itoa(port), 30*time.Second); err != nil {
		t.Fatalf("RabbitMQ node %s: %v", n.name, err)
	}
	return n
}

// ctl runs rabbitmqctl against the node.
func (n *RabbitMQNode) ctl(timeout time.Duration, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args = append([]string{"-n", n.name}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(rabbitmqBin, "rabbitmqctl"), args...)
	cmd.Env = n.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmqctl %v: %w\n%s", args, err, out)
	}
	return nil
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

// KafkaCluster is a private in-process Kafka (kfake) that keeps its data in
// a directory, so that it can be restarted on the same ports.
type KafkaCluster struct {
	t     testing.TB
	dir   string
	ports []int
	opts  KafkaOptions
	mu    sync.Mutex
	c     *kfake.Cluster
}

// StartKafka starts a private in-process Kafka cluster on free loopback
// ports, shaped by opts, with its data in a temporary directory, and closes
// it when the test ends.
func StartKafka(t testing.TB, opts KafkaOptions) *KafkaCluster {
	t.Helper()
	if opts.Brokers <= 0 {
		opts.Brokers = 1
	}
	if opts.Partitions <= 0 {
		opts.Partitions = 1
	}
	k := &KafkaCluster{t: t, dir: t.TempDir(), opts: opts}
	for range opts.Brokers {
		k.ports = append(k.ports, FreePort(t))
	}
	if err := k.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.stop)
	return k
}

// Addrs returns the brokers' addresses, the same across restarts.
func (k *KafkaCluster) Addrs() []string {
	addrs := make([]string, len(k.ports))
	for i, p := range k.ports {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return addrs
}

func (k *KafkaCluster) start() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil {
		return nil
	}
	var err error
	for range 50 { // a port of the last run may linger a moment
		k.c, err = kfake.NewCluster(
			kfake.Ports(k.ports...),
			kfake.DefaultNumPartitions(k.opts.Partitions),
			kfake.ListenFn(loopbackOnly),
			kfake.DataDir(k.dir),
		)
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("start in-process Kafka (kfake) on %v: %w", k.ports, err)
}

func (k *KafkaCluster) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c != nil {
		k.c.Close()
		k.c = nil
	}
}

// Restart closes the cluster (every connection drops) and starts it again
// on the same ports from its data directory. It reports a failure with
// t.Error, so it may run on any goroutine.
func (k *KafkaCluster) Restart() { k.RestartAfter(0) }

// RestartAfter is Restart with the cluster down for d.
func (k *KafkaCluster) RestartAfter(d time.Duration) { restartAfter(k.t, d, k.stop, k.start) }

// restartAfter stops a private broker, waits d and starts it again,
// reporting a failed start with t.Error.
func restartAfter(t testing.TB, d time.Duration, stop func(), start func() error) {
	stop()
	time.Sleep(d)
	if err := start(); err != nil {
		t.Error(err)
	}
}

// waitPort waits until a TCP connection to addr succeeds.
func waitPort(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart kills the server (SIGKILL) and starts it again on its port with
// the same arguments; started with persistence (appendonly yes, appendfsync
// always), it comes back with every write it acknowledged.
func (s *RedisServer) Restart() { s.RestartAfter(0) }

// RestartAfter is Restart with the server down for d.
func (s *RedisServer) RestartAfter(d time.Duration) {
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	s.Stop()
	time.Sleep(d)
	s.Start()
}
