package testserver

import (
	"net"
	"strings"
	"testing"

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
	if o.Brokers <= 0 {
		o.Brokers = 1
	}
	if o.Partitions <= 0 {
		o.Partitions = 1
	}
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
