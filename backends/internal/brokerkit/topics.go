package brokerkit

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TopicSet remembers, per process, the topics whose broker-side setup (a
// Kafka topic, a NATS stream, AMQP queues) is done, with what that setup
// returned.
type TopicSet[V any] struct {
	mu   sync.Mutex
	done map[string]V
}

// NewTopicSet returns an empty TopicSet.
func NewTopicSet[V any]() *TopicSet[V] { return &TopicSet[V]{done: map[string]V{}} }

// Ensure runs setup for topic unless it already succeeded in this process. It
// holds a lock for the whole call, so concurrent first uses run setup once; a
// setup that failed runs again on the next call.
func (s *TopicSet[V]) Ensure(topic string, setup func(topic string) (V, error)) (V, error) {
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

// Forget makes the next Ensure of topic run its setup again.
func (s *TopicSet[V]) Forget(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.done, topic)
}

// EnsuringPublisher runs Ensure before every publish, so that the topic
// exists on the broker (with its queues or stream) before the first message
// is sent to it. Close is the wrapped publisher's.
type EnsuringPublisher struct {
	message.Publisher
	Ensure func(topic string) error
}

var _ message.Publisher = EnsuringPublisher{}

// Publish ensures topic, then publishes msgs to it.
func (p EnsuringPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Ensure(topic); err != nil {
		return err
	}
	return p.Publisher.Publish(topic, msgs...)
}
