package e2e

import (
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// privateBroker starts a private server of the column's broker, which the
// scenario may restart without disturbing the other scenarios, and returns
// its backends URL and how to restart it, down for a second. Each keeps its
// data across a restart, as a broker with a disk does.
func (e *env) privateBroker() (url string, restart func()) {
	const down = time.Second
	switch e.b.kind() {
	case "kafka":
		c := testserver.StartKafka(e.t, testserver.KafkaOptions{Brokers: 3, Partitions: kafkaPartitions})
		return "kafka://" + strings.Join(c.Addrs(), ","), func() { c.RestartAfter(down) }
	case "redis":
		s := testserver.StartRedis(e.t, "--appendonly", "yes", "--appendfsync", "always")
		return "redis://" + s.Addr + "/0", func() { s.RestartAfter(down) }
	case "amqp":
		n := testserver.StartRabbitMQ(e.t)
		return n.URL, func() { n.RestartAfter(down) }
	case "nats":
		s := testserver.StartNATS(e.t)
		return s.URL, func() { s.RestartAfter(down) }
	}
	e.t.Fatalf("no private %s broker", e.b.kind())
	return "", nil
}

// brokerRestart: the scenario's broker is a private server, restarted (down
// for a second) while
// 300 keys stream in (one message every 10 ms, published again until the
// broker takes it) to two consumers. Publishes and acks in flight during
// the restart fail or are lost, and the broker redelivers what it had
// delivered but not seen acked: nothing may be lost, and each effect must
// happen exactly once.
func brokerRestart(e *env) {
	const n, consumers = 300, 2
	url, restart := e.privateBroker()
	e.url = url
	e.publishWith("publisher-private")

	keys := keyNames("r", n)
	e.expectEffects("up", keys)
	e.handle(consumers, e.effectOnce)
	var retried int
	e.publishInBackground(oneCopyEach(keys), func(m *message.Message) {
		// A publish that fails during the restart is retried with the same
		// UUID, as a producer does; one that failed after the broker took
		// it becomes a duplicate.
		for e.pub.Publish(e.topic, m) != nil && e.remaining() > 0 {
			retried++
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
	})
	e.waitFor("a third of the keys done before the restart", func() bool { return e.tr.acks.Load() >= n/3 })
	before, acked := time.Now(), e.tr.acks.Load()
	restart()
	took := time.Since(before)
	e.note = func() string { // read after the publisher is done
		return fmt.Sprintf("broker restarted after %d acks, down and up again in %.1fs; %d publishes retried", acked, took.Seconds(), retried)
	}
	e.requireExactlyOnce()
}

// gochannelRestartNA says why broker-restart does not apply to gochannel.
const gochannelRestartNA = "n/a: gochannel is in the process; there is no broker to restart, and a restart " +
	"of the process takes every message with it"
