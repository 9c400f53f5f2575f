package backends_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Broker restarts, on a private server per test that the test restarts, so
// that no other test loses its broker. Two tests use each: TestRestart_*
// here, and Watermill's own tests.TestReconnect in reconnect_norace_test.go.
// That file builds only without the race detector, for three data races
// that are not ours and that -race reports:
//   - Watermill v1.5.1's TestReconnect appends to its list of published
//     messages on one goroutine and reads it on another with no
//     synchronisation;
//   - watermill-amqp v3.0.2 reassigns ConnectionWrapper.connected when the
//     connection drops while IsConnected reads it (Watermill issue #693),
//     so any RabbitMQ restart under -race fails;
//   - sarama v1.43.3's Broker.Open, reconnecting, rewrites the broker's
//     metrics fields while a Fetch reads them (IBM/sarama issue #3017), so
//     a Kafka restart under -race fails now and then.
//
// TestRestart_AMQP and TestRestart_Kafka are therefore in that file too;
// Redis Streams and NATS restart cleanly under -race.

// privateBroker is a private server and the config that reaches it.
type privateBroker struct {
	cfg     backends.Config
	restart func()
}

func privateRedis(t *testing.T) privateBroker {
	// appendfsync always: a restart after SIGKILL keeps every write the
	// server acknowledged, the consumer group and its pending list included.
	srv := testserver.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	return privateBroker{cfg: backends.Config{
		// Messages read but not acked when the server went away stay
		// pending, and are claimed again after max_idle_time.
		URL:             backendtest.WithParams("redis://"+srv.Addr+"/0", "max_idle_time", "3s", "claim_interval", "1s"),
		Group:           "restart",
		NackResendSleep: backendtest.FastNack,
	}, restart: srv.Restart}
}

func privateNATS(t *testing.T) privateBroker {
	srv := testserver.StartNATS(t)
	return privateBroker{cfg: backends.Config{
		URL:             backendtest.WithParams(srv.URL, "ack_wait", "3s"),
		Group:           "restart",
		NackResendSleep: backendtest.FastNack,
	}, restart: srv.Restart}
}

func privateKafka(t *testing.T) privateBroker {
	cluster := testserver.StartKafka(t, testserver.KafkaOptions{})
	return privateBroker{cfg: backends.Config{
		URL:             "kafka://" + strings.Join(cluster.Addrs(), ","),
		Group:           "restart",
		NackResendSleep: backendtest.FastNack,
		Tune:            fastRebalance,
	}, restart: cluster.Restart}
}

func privateAMQP(t *testing.T) privateBroker {
	node := testserver.StartRabbitMQ(t)
	return privateBroker{cfg: backends.Config{
		URL:             node.URL,
		Group:           "restart",
		NackResendSleep: backendtest.FastNack,
	}, restart: node.Restart}
}

// restartDuring publishes messages from 20 goroutines, retrying each
// publish until the broker takes it, while the broker is restarted after a
// third and after a half of them; a subscriber of the group acks what it
// receives. Every message whose publish returned must arrive (at least
// once: a restart may redeliver what was being acked).
func restartDuring(t *testing.T, b privateBroker) {
	const messages, publishers = 2000, 20
	backend, err := backends.New(b.cfg, backendtest.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	topic := "restart-" + watermill.NewShortUUID()
	if init, ok := backend.Subscriber.(message.SubscribeInitializer); ok {
		require.NoError(t, init.SubscribeInitialize(topic))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	in, err := backend.Subscriber.Subscribe(ctx, topic)
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		published = map[string]bool{}
		received  = map[string]int{}
		restarts  sync.WaitGroup
	)
	// Restarts run in the background, one after the other, while
	// publishing goes on.
	restart := make(chan struct{}, 2)
	restarts.Add(1)
	go func() {
		defer restarts.Done()
		for range restart {
			b.restart()
		}
	}()
	next := make(chan int)
	go func() {
		defer close(next)
		defer close(restart)
		for i := range messages {
			if i == messages/3 || i == messages/2 {
				restart <- struct{}{}
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var pubs sync.WaitGroup
	for range publishers {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			for range next {
				msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
				for {
					err := backend.Publisher.Publish(topic, msg.Copy())
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				mu.Lock()
				published[msg.UUID] = true
				mu.Unlock()
			}
		}()
	}
	allPublished := make(chan struct{})
	go func() { pubs.Wait(); close(allPublished) }()

	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		return missingLocked(published, received)
	}
	allIn := false
	for !allIn || missing() > 0 {
		select {
		case msg, ok := <-in:
			if !ok {
				t.Fatalf("subscription closed with %d messages missing", missing())
			}
			mu.Lock()
			received[msg.UUID]++
			mu.Unlock()
			msg.Ack()
		case <-allPublished:
			allIn = true
			allPublished = nil
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			mu.Lock()
			t.Fatalf("after 50 s: %d of %d published, %d missing", len(published), messages, missingLocked(published, received))
			mu.Unlock()
		}
	}
	restarts.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, published, messages)
	dups := 0
	for _, n := range received {
		dups += n - 1
	}
	t.Logf("%d messages published across two broker restarts, every one received; %d redelivered", len(published), dups)
}

func missingLocked(published map[string]bool, received map[string]int) int {
	n := 0
	for id := range published {
		if received[id] == 0 {
			n++
		}
	}
	return n
}

func TestRestart_RedisStreams(t *testing.T) {
	t.Parallel()
	restartDuring(t, privateRedis(t))
}

func TestRestart_NATS(t *testing.T) {
	t.Parallel()
	restartDuring(t, privateNATS(t))
}
