package amqpbackend_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/amqpname"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// amqpAdmin runs f on a channel of its own to the RabbitMQ server at url.
func amqpAdmin(t *testing.T, url string, f func(ch *amqp091.Channel)) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	f(ch)
}

// queueExists reports whether RabbitMQ has the queue, and how many messages
// wait in it.
func queueExists(t *testing.T, url, queue string) (bool, int) {
	t.Helper()
	var exists bool
	var n int
	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		exists, n = err == nil, q.Messages
	})
	return exists, n
}

// Once a group's queue is gone, a publish that no queue receives is an
// ErrUnroutable: RabbitMQ confirms it and the fanout exchange discards it,
// which Publish used to report as a success.
func TestAMQP_UnroutablePublishIsAnError(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("unroutable")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		_, err := ch.QueueDelete(amqpname.Queue(topic, group), false, false, false)
		require.NoError(t, err)
	})
	err := b.Publisher.Publish(topic, backendtest.NewMessage("two"))
	require.ErrorIs(t, err, backends.ErrUnroutable, "a publish that no queue receives")
}

// With PublishGroups, a publish that comes back unroutable because a listed
// group's queue was deleted declares the queue again and is retried: the
// message waits there for the group.
func TestAMQP_DeletedQueueIsDeclaredAgain(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("redeclare")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	producer := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", group), Group: "producer-" + backendtest.RunID})
	backendtest.Publish(t, producer.Publisher, topic, "one")
	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		_, err := ch.QueuePurge(amqpname.Queue(topic, group), false)
		require.NoError(t, err)
		_, err = ch.QueueDelete(amqpname.Queue(topic, group), false, false, false)
		require.NoError(t, err)
	})
	backendtest.Publish(t, producer.Publisher, topic, "two")

	consumer := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, consumer, topic)
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}

// A service publishes to topics it does not consume (bill consumes orders
// and publishes invoices): the backend declares no queue of its own group
// for them, where it used to declare invoices_<group>, which nobody
// consumed and which filled without bound. The group that consumes
// invoices receives them.
func TestAMQP_NoQueueForATopicTheGroupDoesNotConsume(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	invoices := backendtest.UniqueTopic("invoices")
	billing, accounting := "billing-"+backendtest.RunID, "accounting-"+backendtest.RunID
	t.Cleanup(func() {
		testserver.DeleteAMQP(t, url, []string{invoices}, []string{billing, accounting})
	})

	reader := backendtest.NewBackend(t, backends.Config{URL: url, Group: accounting})
	msgs := backendtest.Subscribe(t, reader, invoices)
	bill := backendtest.NewBackend(t, backends.Config{URL: url, Group: billing})
	backendtest.Publish(t, bill.Publisher, invoices, "invoice 1", "invoice 2", "invoice 3")
	assert.Equal(t, "invoice 1", backendtest.Receive(t, msgs))

	exists, n := queueExists(t, url, amqpname.Queue(invoices, billing))
	assert.False(t, exists, "a queue of the publisher's group on a topic it does not consume (%d messages)", n)
}

// A topic's exchange deleted while the publisher runs: the publish that
// meets the deleted exchange fails, and the next declares it again and
// succeeds, where the per-process declaration cache kept every later
// publish failing.
func TestAMQP_DeletedExchangeIsDeclaredAgain(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("exchange")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", group), Group: group})
	backendtest.Publish(t, b.Publisher, topic, "one")
	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		require.NoError(t, ch.ExchangeDelete(topic, false, false))
	})
	// The first publish after the deletion may fail; one must then succeed.
	if err := b.Publisher.Publish(topic, backendtest.NewMessage("two")); err != nil {
		t.Logf("first publish after the exchange was deleted: %v", err)
		backendtest.Publish(t, b.Publisher, topic, "two")
	}
	msgs := backendtest.Subscribe(t, b, topic)
	assert.Equal(t, "one", backendtest.Receive(t, msgs))
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}

// A group's queue deleted under its running consumer: the consumer gets no
// empty phantom message (watermill-amqp read the zero Delivery of the
// closed deliveries channel and handed it on), subscribes again, declaring
// the queue anew, and receives what is published once the queue is back;
// publishes in between are ErrUnroutable.
func TestAMQP_QueueDeletedUnderItsConsumer(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("cancelled")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		_, err := ch.QueueDelete(amqpname.Queue(topic, group), false, false, false)
		require.NoError(t, err)
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := b.Publisher.Publish(topic, backendtest.NewMessage("two"))
		if err == nil {
			break
		}
		require.ErrorIs(t, err, backends.ErrUnroutable)
		require.True(t, time.Now().Before(deadline), "the consumer did not declare its queue again within 15 s")
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, "two", backendtest.Receive(t, msgs), "the next message, not an empty one")
}

// A listed group's queue deleted while another group's queue still takes
// the topic's messages: mandatory cannot notice (the message is routed), so
// the publisher declares the listed queues at every publish, and the listed
// group still receives.
func TestAMQP_ListedQueueDeletedBesideAnother(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("beside")
	billing, audit := "billing-"+backendtest.RunID, "audit-"+backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{billing, audit}) })

	producer := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", billing+","+audit), Group: "producer-" + backendtest.RunID})
	backendtest.Publish(t, producer.Publisher, topic, "one")
	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		_, err := ch.QueueDelete(amqpname.Queue(topic, billing), false, false, false)
		require.NoError(t, err)
	})
	backendtest.Publish(t, producer.Publisher, topic, "two")

	consumer := backendtest.NewBackend(t, backends.Config{URL: url, Group: billing})
	msgs := backendtest.Subscribe(t, consumer, topic)
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}

// Publishes from many goroutines at once each get their own outcome: a
// message RabbitMQ returns as unroutable fails its own publish and no
// other, and every confirmed message arrives.
func TestAMQP_ConcurrentPublishesGetTheirOwnOutcome(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	routed, unrouted := backendtest.UniqueTopic("concurrent-routed"), backendtest.UniqueTopic("concurrent-unrouted")
	group := "concurrent-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{routed, unrouted}, []string{group}) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	require.NoError(t, b.Subscriber.(message.SubscribeInitializer).SubscribeInitialize(routed))

	const n = 40
	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			topic := routed
			if i%2 == 1 {
				topic = unrouted
			}
			errs[i] = b.Publisher.Publish(topic, backendtest.NewMessage(fmt.Sprint(i)))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if i%2 == 1 {
			assert.ErrorIs(t, err, backends.ErrUnroutable, "publish %d to the topic with no queue", i)
		} else {
			assert.NoError(t, err, "publish %d to the topic with a queue", i)
		}
	}
	msgs := backendtest.Subscribe(t, b, routed)
	got := map[string]bool{}
	for range n {
		got[backendtest.Receive(t, msgs)] = true
	}
	assert.Len(t, got, n, "every confirmed message, once each")
}

// A publish that RabbitMQ answers by closing the channel (the topic's
// exchange exists with another type: 406 PRECONDITION_FAILED) is an error,
// not a hang, and the publisher works again once the exchange is fixed.
func TestAMQP_ChannelClosedByBrokerIsAnError(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("wrong-type")
	group := "wrongtype-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })
	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		require.NoError(t, ch.ExchangeDeclare(topic, "direct", false, true, false, false, nil))
	})
	b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", group), Group: group})

	publishWithin := func(payload string) error {
		done := make(chan error, 1)
		go func() { done <- b.Publisher.Publish(topic, backendtest.NewMessage(payload)) }()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("Publish hung on a channel that RabbitMQ closed")
			return nil
		}
	}
	err := publishWithin("one")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PRECONDITION_FAILED")

	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		require.NoError(t, ch.ExchangeDelete(topic, false, false))
	})
	require.NoError(t, publishWithin("two"))
	assert.Equal(t, "two", backendtest.Receive(t, backendtest.Subscribe(t, b, topic)))
}

// Two (topic, group) pairs whose topic_group reads the same, topic X_eu with
// group billing and topic X with group eu_billing, each have a queue of
// their own and each receive their own topic's messages: they shared the
// queue X_eu_billing, and the subscriber of X_eu took the messages of X.
// The queue that PublishGroups declares is the subscriber's.
func TestAMQP_QueueNamesDoNotCollide(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	x := backendtest.UniqueTopic("collide")
	xEU, group := x+"_eu", "billing-"+backendtest.RunID
	euGroup := "eu_" + group
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{x, xEU}, []string{group, euGroup}) })

	first := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	second := backendtest.NewBackend(t, backends.Config{URL: url, Group: euGroup})
	producer := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", euGroup), Group: "producer-" + backendtest.RunID})
	// Both queues, and their bindings, exist before anything is published.
	require.NoError(t, first.Subscriber.(message.SubscribeInitializer).SubscribeInitialize(xEU))
	backendtest.Publish(t, producer.Publisher, x, "to X")
	backendtest.Publish(t, first.Publisher, xEU, "to X_eu")

	assert.Equal(t, "to X_eu", backendtest.Receive(t, backendtest.Subscribe(t, first, xEU)), "topic X_eu, group billing")
	assert.Equal(t, "to X", backendtest.Receive(t, backendtest.Subscribe(t, second, x)), "topic X, group eu_billing")
}

// Names past RabbitMQ's 255 bytes: amqp091 cut them at their length modulo
// 256 without a word, so two groups of a long name, or two long topics,
// that differ only at the end shared one queue or one exchange. Cut names
// now end in a hash: each group, and each topic, has its own.
func TestAMQP_LongNames(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)

	t.Run("groups", func(t *testing.T) {
		t.Parallel()
		topic := backendtest.UniqueTopic("longgroup")
		// topic_group is 296 bytes, which amqp091 cut to the topic's first 40.
		long := "a-" + backendtest.RunID + strings.Repeat("g", 295-len(topic)-len(backendtest.RunID)-3)
		a, b := long+"1", long+"2"
		t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{a, b}) })

		subA := backendtest.NewBackend(t, backends.Config{URL: url, Group: a})
		subB := backendtest.NewBackend(t, backends.Config{URL: url, Group: b})
		msgsA, msgsB := backendtest.Subscribe(t, subA, topic), backendtest.Subscribe(t, subB, topic)
		backendtest.Publish(t, subA.Publisher, topic, "one")
		assert.Equal(t, "one", backendtest.Receive(t, msgsA), "group …1")
		assert.Equal(t, "one", backendtest.Receive(t, msgsB), "group …2")
		exists, _ := queueExists(t, url, amqpname.Queue(topic, a))
		assert.True(t, exists, "the queue of group …1")
	})

	t.Run("topics", func(t *testing.T) {
		t.Parallel()
		long := backendtest.UniqueTopic("longtopic") + strings.Repeat("t", 250)
		t1, t2 := long+"1", long+"2"
		group := "billing-" + backendtest.RunID
		t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{t1, t2}, []string{group}) })

		b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
		for _, topic := range []string{t1, t2} {
			require.NoError(t, b.Subscriber.(message.SubscribeInitializer).SubscribeInitialize(topic))
		}
		backendtest.Publish(t, b.Publisher, t2, "to …2")
		backendtest.Publish(t, b.Publisher, t1, "to …1")
		assert.Equal(t, "to …1", backendtest.Receive(t, backendtest.Subscribe(t, b, t1)), "topic …1")
		assert.Equal(t, "to …2", backendtest.Receive(t, backendtest.Subscribe(t, b, t2)), "topic …2")
	})
}

// A cut queue name is not the whole name of another pair: the pair of a
// long topic and a group, and the pair (the first 238 bytes of its queue's
// name, the hash that ends it), each have a queue of their own. They shared
// it while cut names were 255 bytes like whole ones.
func TestAMQP_CutQueueNameIsNoOtherPairs(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	long := backendtest.UniqueTopic("cutname")
	long += strings.Repeat("t", 250-len(long))
	group := "billing-" + backendtest.RunID
	q := amqpname.Queue(long, group)
	sep := strings.LastIndexByte(q, '_')
	short, hash := q[:sep], q[sep+1:]
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{long, short}, []string{group, hash}) })

	first := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	second := backendtest.NewBackend(t, backends.Config{URL: url, Group: hash})
	producer := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "publish_groups", hash), Group: "producer-" + backendtest.RunID})
	require.NoError(t, first.Subscriber.(message.SubscribeInitializer).SubscribeInitialize(long))
	backendtest.Publish(t, producer.Publisher, short, "to the short topic")
	backendtest.Publish(t, first.Publisher, long, "to the long topic")

	assert.Equal(t, "to the long topic", backendtest.Receive(t, backendtest.Subscribe(t, first, long)), "long topic")
	assert.Equal(t, "to the short topic", backendtest.Receive(t, backendtest.Subscribe(t, second, short)), "short topic, the hash as group")
}
