package amqpbackend_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/amqpname"
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

	producer := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", group), Group: group})
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

	pub := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", a+","+b), Group: a})
	backendtest.Publish(t, pub.Publisher, topic, "m")

	for _, g := range []string{a, b} {
		sub := backendtest.NewBackend(t, backends.Config{URL: url, Group: g})
		msgs := backendtest.Subscribe(t, sub, topic)
		assert.Equal(t, "m", backendtest.Receive(t, msgs), "group %s", g)
	}
}

// publish_groups is read by the process that publishes, for every topic
// it publishes to: another process that does not list the groups gets
// ErrUnroutable for a topic until a queue exists, and the listing process
// declares the groups' queues on every topic it publishes to, consumed or
// not.
func TestAMQP_PublishGroupsArePerProcess(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	orders, invoices := backendtest.UniqueTopic("orders"), backendtest.UniqueTopic("invoices")
	billing := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{orders, invoices}, []string{billing}) })

	listing := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", billing), Group: "api-" + backendtest.RunID})
	other := backendtest.NewBackend(t, backends.Config{URL: url, Group: "api-" + backendtest.RunID})

	require.ErrorIs(t, other.Publisher.Publish(orders, backendtest.NewMessage("lost")), backends.ErrUnroutable)
	backendtest.Publish(t, listing.Publisher, orders, "one")
	backendtest.Publish(t, listing.Publisher, invoices, "invoice")
	backendtest.Publish(t, other.Publisher, orders, "two") // the queue exists now

	exists, n := queueExists(t, url, amqpname.Queue(invoices, billing))
	assert.True(t, exists && n == 1, "billing's queue on invoices, which it does not consume: exists %v, %d messages", exists, n)
	consumer := backendtest.NewBackend(t, backends.Config{URL: url, Group: billing})
	msgs := backendtest.Subscribe(t, consumer, orders)
	assert.Equal(t, "one", backendtest.Receive(t, msgs))
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}

// The README's router puts Watermill's poison queue in front of the
// handler. On RabbitMQ its publish to the poison topic is ErrUnroutable
// while no group's queue is bound to that topic, so the message is nacked
// and comes back instead of moving; once a group subscribed to the poison
// topic (SubscribeInitialize is enough), it moves there.
func TestAMQP_PoisonTopicNeedsAQueue(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	poisonTopic := backendtest.UniqueTopic("orders_poison")
	group, poisonGroup := "billing-"+backendtest.RunID, "poison-"+backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{poisonTopic}, []string{poisonGroup}) })

	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	poison, err := middleware.PoisonQueue(b.Publisher, poisonTopic)
	require.NoError(t, err)
	handler := poison(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("permanent") })

	_, err = handler(backendtest.NewMessage("bad"))
	require.ErrorIs(t, err, backends.ErrUnroutable, "no queue on the poison topic: the message stays")

	inspect, err := b.SubscriberForGroup(poisonGroup)
	require.NoError(t, err)
	require.NoError(t, inspect.(message.SubscribeInitializer).SubscribeInitialize(poisonTopic))
	_, err = handler(backendtest.NewMessage("bad"))
	require.NoError(t, err, "moved to the poison queue")
	msgs, err := inspect.Subscribe(context.Background(), poisonTopic)
	require.NoError(t, err)
	assert.Equal(t, "bad", backendtest.Receive(t, msgs))
}
