package amqpbackend_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Tests of the defaults this backend sets over its library's, one per trap.

// An AMQP message published before its group ever subscribed must wait in
// the group's queue when the group is listed in PublishGroups: a fanout
// exchange drops what no queue is bound to.
func TestAMQP_QueueDeclaredBeforeFirstPublish(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("early")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	producer := backendtest.NewBackend(t, backends.Config{URL: url, Group: group, AMQP: backends.AMQPConfig{PublishGroups: []string{group}}})
	backendtest.Publish(t, producer.Publisher, topic, "early")
	require.NoError(t, producer.Close())

	consumer := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, consumer, topic)
	assert.Equal(t, "early", backendtest.Receive(t, msgs))
}

// Without PublishGroups, a publish before any group subscribed to the topic
// has no queue to go to: an ErrUnroutable, not a silent drop.
func TestAMQP_PublishBeforeAnyGroupIsAnError(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("nobody")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	producer := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	require.ErrorIs(t, producer.Publisher.Publish(topic, backendtest.NewMessage("early")), backends.ErrUnroutable)
}

// Within a group AMQP consumers compete; across groups each gets every
// message.
func TestAMQP_GroupsFanOut(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("fanout")
	a, b := "a-"+backendtest.RunID, "b-"+backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{a, b}) })

	pub := backendtest.NewBackend(t, backends.Config{URL: url, Group: a, AMQP: backends.AMQPConfig{PublishGroups: []string{a, b}}})
	backendtest.Publish(t, pub.Publisher, topic, "m")

	for _, g := range []string{a, b} {
		sub := backendtest.NewBackend(t, backends.Config{URL: url, Group: g})
		msgs := backendtest.Subscribe(t, sub, topic)
		assert.Equal(t, "m", backendtest.Receive(t, msgs), "group %s", g)
	}
}
