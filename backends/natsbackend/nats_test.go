package natsbackend_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// A NATS message whose header has two values (JetStream carries them;
// watermill-nats cannot decode them) reaches the handler with the values
// joined, where it used to be terminated unseen.
func TestNATS_RepeatedHeaderIsHandedOn(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("headers")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: "billing-" + backendtest.RunID})
	msgs := backendtest.Subscribe(t, b, topic) // creates the stream

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	m := nats.NewMsg(topic)
	m.Data = []byte("odd headers")
	m.Header.Set("_watermill_message_uuid", "uuid-1")
	m.Header.Add("requestId", "order-7")
	m.Header.Add("Tag", "a")
	m.Header.Add("Tag", "b")
	_, err = js.PublishMsg(m)
	require.NoError(t, err)

	select {
	case got := <-msgs:
		require.NotNil(t, got)
		assert.Equal(t, "uuid-1", got.UUID)
		assert.Equal(t, "order-7", got.Metadata.Get("requestId"))
		assert.Equal(t, "a, b", got.Metadata.Get("Tag"), "the values of a repeated header, joined in order")
		got.Ack()
	case <-time.After(15 * time.Second):
		t.Fatal("a message with a repeated header never reached the handler")
	}
}

// A message republished with its UUID unchanged, as Watermill's requeuer
// does, is delivered again: the backend no longer sends the UUID as
// Nats-Msg-Id, which JetStream would take for a duplicate and drop while
// Publish returned nil.
func TestNATS_RepublishedUUIDIsDelivered(t *testing.T) {
	t.Parallel()
	cfg, topic := shortAckWait(t, "republish")
	b := backendtest.NewBackend(t, cfg)
	msgs := backendtest.Subscribe(t, b, topic)
	m := message.NewMessage(watermill.NewUUID(), []byte("again"))
	require.NoError(t, b.Publisher.Publish(topic, m))
	assert.Equal(t, "again", backendtest.Receive(t, msgs))
	require.NoError(t, b.Publisher.Publish(topic, message.NewMessage(m.UUID, []byte("again"))))
	assert.Equal(t, "again", backendtest.Receive(t, msgs), "the republished copy")
}

// A publish that JetStream drops as a duplicate (the message set its own
// Nats-Msg-Id) is an ErrDuplicatePublish, not a success.
func TestNATS_DroppedDuplicateIsAnError(t *testing.T) {
	t.Parallel()
	cfg, topic := shortAckWait(t, "duplicate")
	b := backendtest.NewBackend(t, cfg)
	first := message.NewMessage(watermill.NewUUID(), []byte("x"))
	first.Metadata.Set(nats.MsgIdHdr, "order-7")
	require.NoError(t, b.Publisher.Publish(topic, first))
	second := message.NewMessage(watermill.NewUUID(), []byte("x"))
	second.Metadata.Set(nats.MsgIdHdr, "order-7")
	err := b.Publisher.Publish(topic, second)
	require.ErrorIs(t, err, backends.ErrDuplicatePublish)
}

// A message that waited in the client behind a slow predecessor for most of
// AckWait is not redelivered while its own handler runs: the subscriber
// restarts its AckWait when the handler receives it. Before, the first
// progress ack went out only AckWait/3 after that, by when the server had
// redelivered it.
func TestNATS_BufferedMessageKeepsItsAckWait(t *testing.T) {
	t.Parallel()
	const ackWait = 4 * time.Second
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("buffered")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "ack_wait", ackWait.String()), Group: "billing-" + backendtest.RunID})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "slow", "buffered")

	first := <-msgs
	require.Equal(t, "slow", string(first.Payload))
	time.Sleep(ackWait * 8 / 10) // "buffered" waits in the client meanwhile
	first.Ack()

	var second *message.Message
	select {
	case second = <-msgs:
	case <-time.After(15 * time.Second):
		t.Fatal("no second message")
	}
	require.Equal(t, "buffered", string(second.Payload))
	time.Sleep(ackWait / 2) // its handler works
	second.Ack()
	backendtest.NothingFor(t, msgs, ackWait/2)
}

// A topic's stream deleted after the publisher first used it (an operator,
// a retention policy, a restored server) is created again by the next
// publish: the publisher remembered the stream for the process, and every
// publish to the topic then failed with no responders until a restart.
func TestNATS_DeletedStreamIsCreatedAgain(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("deleted-stream")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: "billing-" + backendtest.RunID})
	backendtest.Publish(t, b.Publisher, topic, "one")

	testserver.DeleteNATSStreams(t, url, topic)
	require.NoError(t, b.Publisher.Publish(topic, backendtest.NewMessage("two")), "a publish after the stream was deleted")

	msgs := backendtest.Subscribe(t, b, topic)
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}

// recreatedWithin bounds the wait for a message after a stream or durable
// was deleted: the subscriber notices within seconds; the bound only fails
// a subscriber that never does.
const recreatedWithin = 60 * time.Second

// receiveWithin reads one message within d, acks it and returns its payload.
func receiveWithin(t *testing.T, msgs <-chan *message.Message, d time.Duration) string {
	t.Helper()
	select {
	case m := <-msgs:
		require.NotNil(t, m, "channel closed")
		m.Ack()
		return string(m.Payload)
	case <-time.After(d):
		t.Fatalf("no message within %s", d)
		return ""
	}
}

// A topic's stream deleted under a running subscriber takes the group's
// durable with it. The publisher creates the stream again; the subscriber
// creates the durable again and subscribes anew, so the next message
// reaches it. Before, it waited in the new stream until a restart.
func TestNATS_SubscriberRejoinsRecreatedStream(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("rejoin")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: "billing-" + backendtest.RunID})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	require.NoError(t, brokeradmin.DeleteNATSStreams(url, topic))
	backendtest.Publish(t, b.Publisher, topic, "two")
	assert.Equal(t, "two", receiveWithin(t, msgs, recreatedWithin), "the first message in the new stream")
	backendtest.Publish(t, b.Publisher, topic, "three")
	assert.Equal(t, "three", backendtest.Receive(t, msgs))
}

// The same when nothing of the backend's publishes to the topic after the
// stream is deleted: the subscriber creates the stream as well as the
// durable, so a message published straight to JetStream is captured and
// delivered.
func TestNATS_SubscriberRecreatesDeletedStream(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("rejoin-alone")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: "billing-" + backendtest.RunID})
	msgs := backendtest.Subscribe(t, b, topic)
	require.NoError(t, brokeradmin.DeleteNATSStreams(url, topic))

	js, closeConn, err := brokeradmin.JetStream(url)
	require.NoError(t, err)
	defer closeConn()
	m := nats.NewMsg(topic)
	m.Data = []byte("direct")
	m.Header.Set("_watermill_message_uuid", watermill.NewUUID())
	require.Eventually(t, func() bool {
		_, err := js.PublishMsg(m)
		return err == nil
	}, recreatedWithin, 100*time.Millisecond, "no stream captures the topic again")
	assert.Equal(t, "direct", backendtest.Receive(t, msgs))
}

// A group's durable deleted alone, its stream kept, is created again by a
// running member too. It reads the stream from its start again, as it would
// after a restart: what the group had acked comes again (the idempotency
// middleware acks it as a duplicate), nothing is skipped.
func TestNATS_SubscriberRecreatesDeletedDurable(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("rejoin-durable")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	js, closeConn, err := brokeradmin.JetStream(url)
	require.NoError(t, err)
	defer closeConn()
	stream, err := js.StreamNameBySubject(topic)
	require.NoError(t, err)
	var durables []string
	for n := range js.ConsumerNames(stream) {
		durables = append(durables, n)
	}
	require.Len(t, durables, 1)
	require.NoError(t, js.DeleteConsumer(stream, durables[0]))
	backendtest.Publish(t, b.Publisher, topic, "two")

	assert.Equal(t, "one", receiveWithin(t, msgs, recreatedWithin), "the stream again from its start")
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}

// A message a handler held while its stream was deleted and created again
// is settled after the group's new durable delivered the new stream's
// first message, which has the same stream sequence. The held message's
// ack must not settle the new one: nacked, the new one comes again.
func TestNATS_AckOfHeldMessageAfterRecreationSettlesNothingNew(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("held-ack")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: "billing-" + backendtest.RunID,
		NackResendSleep: 10 * time.Millisecond})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "old")
	var held *message.Message
	select {
	case held = <-msgs:
	case <-time.After(recreatedWithin):
		t.Fatal("no message")
	}
	require.Equal(t, "old", string(held.Payload))

	require.NoError(t, brokeradmin.DeleteNATSStreams(url, topic))
	backendtest.Publish(t, b.Publisher, topic, "new")
	var fresh *message.Message
	select {
	case fresh = <-msgs:
	case <-time.After(recreatedWithin):
		t.Fatal("no message from the new stream")
	}
	require.Equal(t, "new", string(fresh.Payload))

	held.Ack()
	fresh.Nack()
	assert.Equal(t, "new", receiveWithin(t, msgs, recreatedWithin), "the nacked message again")
}

// A member that finds its group's durable created again by another
// process (here the test, right after the stream's deletion, as the other
// member would) keeps receiving: with the other member gone, it gets the
// next message.
func TestNATS_MemberFindsDurableCreatedElsewhere(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("rejoin-other")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: "billing-" + backendtest.RunID})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	js, closeConn, err := brokeradmin.JetStream(url)
	require.NoError(t, err)
	defer closeConn()
	name, err := js.StreamNameBySubject(topic)
	require.NoError(t, err)
	stream, err := js.StreamInfo(name)
	require.NoError(t, err)
	var durables []*nats.ConsumerInfo
	for c := range js.ConsumersInfo(name) {
		durables = append(durables, c)
	}
	require.Len(t, durables, 1)
	require.NoError(t, js.DeleteStream(name))
	_, err = js.AddStream(&stream.Config)
	require.NoError(t, err)
	_, err = js.AddConsumer(name, &durables[0].Config)
	require.NoError(t, err)

	backendtest.Publish(t, b.Publisher, topic, "two")
	assert.Equal(t, "two", receiveWithin(t, msgs, recreatedWithin), "the first message in the new stream")
	backendtest.Publish(t, b.Publisher, topic, "three")
	assert.Equal(t, "three", receiveWithin(t, msgs, recreatedWithin))
}

// Two (group, topic) pairs whose group_topic reads the same, group
// billing_eu on topic X and group billing on topic eu_X, on one stream that
// captures both topics: the second pair finds the first one's durable
// under the name they share, and nats.go refuses to bind to it, where it
// would take topic X's messages.
func TestNATS_DurableOfAnotherTopicIsNotShared(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	x := backendtest.UniqueTopic("shared")
	euX := "eu_" + x
	group := "billing-" + backendtest.RunID
	js, closeConn, err := brokeradmin.JetStream(url)
	require.NoError(t, err)
	defer closeConn()
	_, err = js.AddStream(&nats.StreamConfig{Name: "both-" + x, Subjects: []string{x, euX}})
	require.NoError(t, err)
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, x) })

	first := backendtest.NewBackend(t, backends.Config{URL: url, Group: group + "_eu"})
	second := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, first, x)
	_, err = second.Subscriber.Subscribe(context.Background(), euX)
	require.ErrorIs(t, err, nats.ErrSubjectMismatch, "group billing on eu_X")

	backendtest.Publish(t, first.Publisher, x, "to X")
	assert.Equal(t, "to X", backendtest.Receive(t, msgs), "group billing_eu on X")
}

// The same when another process created the stream and the durable again
// (here the test, right after the deletion): the subscriber learns of it
// from the durable's new creation time at its next check, subscribes anew,
// and leaves the held message unsettled.
func TestNATS_AckOfHeldMessageAfterRecreationElsewhereSettlesNothingNew(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("held-ack-other")
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams(url, "ack_wait", "2s"), Group: "billing-" + backendtest.RunID,
		NackResendSleep: 10 * time.Millisecond})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "old")
	var held *message.Message
	select {
	case held = <-msgs:
	case <-time.After(recreatedWithin):
		t.Fatal("no message")
	}
	require.Equal(t, "old", string(held.Payload))

	js, closeConn, err := brokeradmin.JetStream(url)
	require.NoError(t, err)
	defer closeConn()
	name, err := js.StreamNameBySubject(topic)
	require.NoError(t, err)
	stream, err := js.StreamInfo(name)
	require.NoError(t, err)
	var durables []*nats.ConsumerInfo
	for c := range js.ConsumersInfo(name) {
		durables = append(durables, c)
	}
	require.Len(t, durables, 1)
	require.NoError(t, js.DeleteStream(name))
	_, err = js.AddStream(&stream.Config)
	require.NoError(t, err)
	_, err = js.AddConsumer(name, &durables[0].Config)
	require.NoError(t, err)

	backendtest.Publish(t, b.Publisher, topic, "new")
	var fresh *message.Message
	select {
	case fresh = <-msgs:
	case <-time.After(recreatedWithin):
		t.Fatal("no message from the new stream")
	}
	require.Equal(t, "new", string(fresh.Payload))
	held.Ack()
	fresh.Nack()
	assert.Equal(t, "new", receiveWithin(t, msgs, recreatedWithin), "the nacked message again")
}
