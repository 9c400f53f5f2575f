package natsbackend_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Tests of the defaults this backend sets over its library's, one per trap.

// A NATS group's durable consumer must outlive its subscribers: nats.go
// deletes a consumer it created itself when the subscription closes, and the
// next start would then replay the whole stream.
func TestNATS_DurableSurvivesClose(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic("durable")
	cfg := backends.Config{URL: url, Group: "billing-" + backendtest.RunID}
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })

	first := backendtest.NewBackend(t, cfg)
	msgs := backendtest.Subscribe(t, first, topic)
	backendtest.Publish(t, first.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))
	require.NoError(t, first.Close())

	second := backendtest.NewBackend(t, cfg)
	backendtest.Publish(t, second.Publisher, topic, "two")

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	stream, err := js.StreamNameBySubject(topic)
	require.NoError(t, err)
	names := js.ConsumerNames(stream)
	var durables []string
	for n := range names {
		durables = append(durables, n)
	}
	require.Len(t, durables, 1, "the group's durable must survive its subscriber's Close")
	info, err := js.ConsumerInfo(stream, durables[0])
	require.NoError(t, err)
	assert.Equal(t, nats.AckExplicitPolicy, info.Config.AckPolicy)
	assert.Equal(t, 60*time.Second, info.Config.AckWait, "default AckWait")
	assert.Equal(t, 100, info.Config.MaxAckPending, "default MaxAckPending")

	msgs = backendtest.Subscribe(t, second, topic)
	assert.Equal(t, "two", backendtest.Receive(t, msgs), "a restarted group resumes after its last ack")
	backendtest.NothingFor(t, msgs, 500*time.Millisecond)
}

// A NATS message that is neither acked nor nacked must come back (no
// auto-ack), to another member of the group.
func TestNATS_UnackedMessageIsRedelivered(t *testing.T) {
	t.Parallel()
	cfg, topic := shortAckWait(t, "manualack")

	crashed := backendtest.NewBackend(t, cfg)
	msgs := backendtest.Subscribe(t, crashed, topic)
	backendtest.Publish(t, crashed.Publisher, topic, "work")
	select {
	case m := <-msgs:
		require.Equal(t, "work", string(m.Payload)) // and never acked
	case <-time.After(15 * time.Second):
		t.Fatal("no message")
	}
	require.NoError(t, crashed.Close())

	survivor := backendtest.NewBackend(t, cfg)
	msgs = backendtest.Subscribe(t, survivor, topic)
	assert.Equal(t, "work", backendtest.Receive(t, msgs))
}

// A NATS handler that runs longer than AckWait keeps its message: the
// subscriber sends progress acks, so the server does not hand it to another
// member, and the handler's context is not cancelled.
func TestNATS_SlowHandlerKeepsItsMessage(t *testing.T) {
	t.Parallel()
	cfg, topic := shortAckWait(t, "slow")

	busy := backendtest.NewBackend(t, cfg)
	msgs := backendtest.Subscribe(t, busy, topic)
	other := backendtest.NewBackend(t, cfg)
	otherMsgs := backendtest.Subscribe(t, other, topic)

	backendtest.Publish(t, busy.Publisher, topic, "slow work")
	var m *message.Message
	select {
	case m = <-msgs:
	case m = <-otherMsgs:
		msgs, otherMsgs = otherMsgs, msgs
	case <-time.After(15 * time.Second):
		t.Fatal("no message")
	}
	// Three AckWaits of work: nobody else may get the message meanwhile.
	backendtest.NothingFor(t, otherMsgs, 3*time.Second)
	require.NoError(t, m.Context().Err(), "the handler's context stays live while it works")
	m.Ack()
	backendtest.NothingFor(t, msgs, 1500*time.Millisecond)
	backendtest.NothingFor(t, otherMsgs, 100*time.Millisecond)
}

// shortAckWait returns the config of a group on the shared NATS server
// with an AckWait of one second, and a topic of the test's own, whose stream
// is deleted when the test ends.
func shortAckWait(t *testing.T, topicPrefix string) (backends.Config, string) {
	url := testserver.NATSURL(t)
	topic := backendtest.UniqueTopic(topicPrefix)
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	return backends.Config{URL: backendtest.WithParams(url, "ack_wait", "1s"), Group: "billing-" + backendtest.RunID}, topic
}
