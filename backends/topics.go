package backends

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// topicSet remembers, per process, the topics whose broker-side setup (a
// Kafka topic, a NATS stream, AMQP queues) is done, with what that setup
// returned.
type topicSet[V any] struct {
	mu   sync.Mutex
	done map[string]V
}

func newTopicSet[V any]() *topicSet[V] { return &topicSet[V]{done: map[string]V{}} }

// ensure runs setup for topic unless it already succeeded in this process. It
// holds a lock for the whole call, so concurrent first uses run setup once; a
// setup that failed runs again on the next call.
func (s *topicSet[V]) ensure(topic string, setup func(topic string) (V, error)) (V, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.done[topic]; ok {
		return v, nil
	}
	v, err := setup(topic)
	if err != nil {
		return v, err
	}
	s.done[topic] = v
	return v, nil
}

// forget makes the next ensure of topic run its setup again.
func (s *topicSet[V]) forget(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.done, topic)
}

// ensuringPublisher runs ensure before every publish, so that the topic
// exists on the broker (with its queues or stream) before the first message
// is sent to it. Close is the wrapped publisher's.
type ensuringPublisher struct {
	message.Publisher
	ensure func(topic string) error
}

var _ message.Publisher = ensuringPublisher{}

func (p ensuringPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.ensure(topic); err != nil {
		return err
	}
	return p.Publisher.Publish(topic, msgs...)
}
