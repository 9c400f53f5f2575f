package testserver

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaOptions shapes the in-process Kafka cluster that KafkaBrokers starts
// when KAFKA_BROKERS is unset. It has no effect on a shared cluster.
type KafkaOptions struct {
	// Brokers is the number of brokers in the cluster. Zero means 1.
	Brokers int
	// Partitions is the partition count of topics created without one
	// (auto-created, or CreateTopics with -1). Zero means 1.
	Partitions int
}

// KafkaBrokers returns the seed addresses of a Kafka cluster.
//
// With KAFKA_BROKERS set (comma-separated host:port), it returns that shared
// cluster and fails the test when its first broker does not answer; -short
// skips the test. Otherwise it starts an in-process kfake cluster on free
// loopback ports, shaped by opts (at most one), and closes it when the test
// ends. The in-process cluster runs under -short too: it needs no server.
// Auto topic creation is off, as on most production clusters, so code under
// test must create its topics.
func KafkaBrokers(t testing.TB, opts ...KafkaOptions) []string {
	t.Helper()
	if len(opts) > 1 {
		t.Fatalf("KafkaBrokers: at most one KafkaOptions, got %d", len(opts))
	}
	if env := Env("KAFKA_BROKERS", ""); env != "" {
		var brokers []string
		for _, b := range strings.Split(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		if len(brokers) == 0 {
			t.Fatalf("KAFKA_BROKERS=%q names no broker", env)
		}
		requireService(t, "Kafka", "KAFKA_BROKERS", brokers[0])
		return brokers
	}

	var o KafkaOptions
	if len(opts) == 1 {
		o = opts[0]
	}
	o = o.withDefaults()
	// kfake listens on 127.0.0.1:0 per broker unless given ports, so the
	// kernel picks free ports and nothing can race us for them.
	c, err := kfake.NewCluster(
		kfake.NumBrokers(o.Brokers),
		kfake.DefaultNumPartitions(o.Partitions),
		kfake.ListenFn(loopbackOnly),
	)
	if err != nil {
		t.Fatalf("start in-process Kafka (kfake): %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// loopbackOnly pins every kfake listener to the loopback interface.
func loopbackOnly(network, address string) (net.Listener, error) {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
}

// withDefaults returns o with its zero fields set to their meaning.
func (o KafkaOptions) withDefaults() KafkaOptions {
	if o.Brokers <= 0 {
		o.Brokers = 1
	}
	if o.Partitions <= 0 {
		o.Partitions = 1
	}
	return o
}

// KafkaCluster is a private in-process Kafka (kfake) that keeps its data in
// a directory, so that it can be restarted on the same ports.
type KafkaCluster struct {
	dir   string
	ports []int
	opts  KafkaOptions
	c     *kfake.Cluster
	life  lifecycle
}

// StartKafka starts a private in-process Kafka cluster on free loopback
// ports, shaped by opts, with its data in a temporary directory, and closes
// it when the test ends.
func StartKafka(t testing.TB, opts KafkaOptions) *KafkaCluster {
	t.Helper()
	k := &KafkaCluster{dir: t.TempDir(), opts: opts.withDefaults()}
	for range k.opts.Brokers {
		k.ports = append(k.ports, FreePort(t))
	}
	k.life = lifecycle{t: t, up: k.up, down: k.down}
	if err := k.life.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.life.stop)
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

// up starts the cluster on its ports from its data directory.
func (k *KafkaCluster) up() error {
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

// down closes the cluster; every connection drops.
func (k *KafkaCluster) down() {
	k.c.Close()
	k.c = nil
}

// Restart closes the cluster (every connection drops) and starts it again
// on the same ports from its data directory. It reports a failure with
// t.Error, so it may run on any goroutine.
func (k *KafkaCluster) Restart() { k.RestartAfter(0) }

// RestartAfter is Restart with the cluster down for d.
func (k *KafkaCluster) RestartAfter(d time.Duration) { k.life.restartAfter(d) }
