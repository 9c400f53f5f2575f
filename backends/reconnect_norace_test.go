//go:build !race

package backends_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Watermill's own tests.TestReconnect on each broker: 10,000 messages from
// 100 publishers while the suite restarts the private broker twice, by
// running Features.RestartServiceCommand, which asks this process to
// restart it (testserver.RestartCommand). It is built only without the
// race detector: see reconnect_test.go.

func TestRestart_AMQP(t *testing.T) {
	t.Parallel()
	restartDuring(t, privateAMQP(t))
}

func watermillReconnect(t *testing.T, b privateBroker) {
	features := tests.Features{
		ConsumerGroups:        true,
		Persistent:            true,
		RestartServiceCommand: testserver.RestartCommand(t, b.restart),
		GenerateTopicFunc:     func(tctx tests.TestContext) string { return "reconnect-" + string(tctx.TestID) },
	}
	ctor := func(t *testing.T) (message.Publisher, message.Subscriber) {
		backend, err := backends.New(b.cfg, backendtest.Logger())
		require.NoError(t, err)
		g := &publishGate{published: map[string]*publishMark{}}
		return gatedPublisher{backend.Publisher, g}, gatedSubscriber{backend.Subscriber, g}
	}
	tests.TestReconnect(t, tests.TestContext{TestID: tests.NewTestID(), Features: features}, ctor)
}

func TestReconnect_RedisStreams(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateRedis(t))
}

func TestReconnect_NATS(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateNATS(t))
}

func TestReconnect_Kafka(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateKafka(t))
}

func TestReconnect_AMQP(t *testing.T) {
	t.Parallel()
	watermillReconnect(t, privateAMQP(t))
}

func TestRestart_Kafka(t *testing.T) {
	t.Parallel()
	restartDuring(t, privateKafka(t))
}

// The harness of tests.TestReconnect records each message whose Publish
// returned from a goroutine of its own, and compares that record with what
// the subscriber received without waiting for the goroutine: a message
// received before it is recorded reads as "extra" (seen on Kafka, where
// the last messages arrive within microseconds of their Publish). The gate
// below hands a received message to the suite only after its Publish
// returned and a moment passed for the harness to record it; what arrives,
// and how often, is the broker's alone.

// recordGrace is the moment the harness is given to record a publish.
const recordGrace = 20 * time.Millisecond

type publishGate struct {
	mu        sync.Mutex
	published map[string]*publishMark
}

type publishMark struct {
	done chan struct{}
	at   time.Time
}

func (g *publishGate) mark(uuid string) *publishMark {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.published[uuid]
	if m == nil {
		m = &publishMark{done: make(chan struct{})}
		g.published[uuid] = m
	}
	return m
}

func (g *publishGate) publishedNow(uuid string) {
	m := g.mark(uuid)
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-m.done:
	default:
		m.at = time.Now()
		close(m.done)
	}
}

type gatedPublisher struct {
	message.Publisher
	g *publishGate
}

func (p gatedPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	if err == nil {
		for _, m := range msgs {
			p.g.publishedNow(m.UUID)
		}
	}
	return err
}

type gatedSubscriber struct {
	message.Subscriber
	g *publishGate
}

func (s gatedSubscriber) SubscribeInitialize(topic string) error {
	if init, ok := s.Subscriber.(message.SubscribeInitializer); ok {
		return init.SubscribeInitialize(topic)
	}
	return nil
}

func (s gatedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			m := s.g.mark(msg.UUID)
			select {
			case <-m.done:
			case <-ctx.Done():
				return
			}
			s.g.mu.Lock()
			wait := recordGrace - time.Since(m.at)
			s.g.mu.Unlock()
			if wait > 0 {
				time.Sleep(wait)
			}
			select {
			case out <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
