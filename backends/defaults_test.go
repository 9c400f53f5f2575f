package backends_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Tests of the defaults each backend sets over its library's, one per trap.

func newBackend(t *testing.T, cfg backends.Config) *backends.Backend {
	t.Helper()
	b, err := backends.New(cfg, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func uniqueTopic(prefix string) string { return prefix + "-" + runID + "-" + watermill.NewShortUUID() }

func publish(t *testing.T, pub message.Publisher, topic string, payloads ...string) {
	t.Helper()
	for _, p := range payloads {
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(p))))
	}
}

// subscribe subscribes b to topic.
func subscribe(t *testing.T, b *backends.Backend, topic string) <-chan *message.Message {
	t.Helper()
	msgs, err := b.Subscriber.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	return msgs
}

// receive reads one message, acks it and returns its payload.
func receive(t *testing.T, msgs <-chan *message.Message) string {
	t.Helper()
	select {
	case m := <-msgs:
		require.NotNil(t, m, "channel closed")
		m.Ack()
		return string(m.Payload)
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15 s")
		return ""
	}
}

// nothingFor fails if a message arrives within d.
func nothingFor(t *testing.T, msgs <-chan *message.Message, d time.Duration) {
	t.Helper()
	select {
	case m := <-msgs:
		if m != nil {
			t.Fatalf("unexpected message %q", m.Payload)
		}
	case <-time.After(d):
	}
}

// A NATS group's durable consumer must outlive its subscribers: nats.go
// deletes a consumer it created itself when the subscription closes, and the
// next start would then replay the whole stream.
func TestNATS_DurableSurvivesClose(t *testing.T) {
	t.Parallel()
	url := testserver.NATSURL(t)
	topic := uniqueTopic("durable")
	cfg := backends.Config{URL: url, Group: "billing-" + runID}
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })

	first := newBackend(t, cfg)
	msgs := subscribe(t, first, topic)
	publish(t, first.Publisher, topic, "one")
	assert.Equal(t, "one", receive(t, msgs))
	require.NoError(t, first.Close())

	second := newBackend(t, cfg)
	publish(t, second.Publisher, topic, "two")

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

	msgs = subscribe(t, second, topic)
	assert.Equal(t, "two", receive(t, msgs), "a restarted group resumes after its last ack")
	nothingFor(t, msgs, 500*time.Millisecond)
}

// A NATS message that is neither acked nor nacked must come back (no
// auto-ack), to another member of the group.
func TestNATS_UnackedMessageIsRedelivered(t *testing.T) {
	t.Parallel()
	cfg, topic := shortAckWait(t, "manualack")

	crashed := newBackend(t, cfg)
	msgs := subscribe(t, crashed, topic)
	publish(t, crashed.Publisher, topic, "work")
	select {
	case m := <-msgs:
		require.Equal(t, "work", string(m.Payload)) // and never acked
	case <-time.After(15 * time.Second):
		t.Fatal("no message")
	}
	require.NoError(t, crashed.Close())

	survivor := newBackend(t, cfg)
	msgs = subscribe(t, survivor, topic)
	assert.Equal(t, "work", receive(t, msgs))
}

// A NATS handler that runs longer than AckWait keeps its message: the
// subscriber sends progress acks, so the server does not hand it to another
// member, and the handler's context is not cancelled.
func TestNATS_SlowHandlerKeepsItsMessage(t *testing.T) {
	t.Parallel()
	cfg, topic := shortAckWait(t, "slow")

	busy := newBackend(t, cfg)
	msgs := subscribe(t, busy, topic)
	other := newBackend(t, cfg)
	otherMsgs := subscribe(t, other, topic)

	publish(t, busy.Publisher, topic, "slow work")
	var m *message.Message
	select {
	case m = <-msgs:
	case m = <-otherMsgs:
		msgs, otherMsgs = otherMsgs, msgs
	case <-time.After(15 * time.Second):
		t.Fatal("no message")
	}
	// Three AckWaits of work: nobody else may get the message meanwhile.
	nothingFor(t, otherMsgs, 3*time.Second)
	require.NoError(t, m.Context().Err(), "the handler's context stays live while it works")
	m.Ack()
	nothingFor(t, msgs, 1500*time.Millisecond)
	nothingFor(t, otherMsgs, 100*time.Millisecond)
}

// shortAckWait returns the config of a group on the shared NATS server
// with an AckWait of one second, and a topic of the test's own, whose stream
// is deleted when the test ends.
func shortAckWait(t *testing.T, topicPrefix string) (backends.Config, string) {
	url := testserver.NATSURL(t)
	topic := uniqueTopic(topicPrefix)
	t.Cleanup(func() { testserver.DeleteNATSStreams(t, url, topic) })
	return backends.Config{URL: url, Group: "billing-" + runID, NATS: backends.NATSConfig{AckWait: time.Second}}, topic
}

// deleteNATSStreams deletes the streams whose names start with prefix.
func deleteNATSStreams(t *testing.T, url, prefix string) {
	testserver.WithJetStream(t, url, func(js nats.JetStreamContext) {
		var doomed []string
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, prefix) {
				doomed = append(doomed, name)
			}
		}
		for _, name := range doomed {
			_ = js.DeleteStream(name)
		}
	})
}

// An AMQP message published before its group ever subscribed must wait in
// the group's queue when the group is listed in PublishGroups: a fanout
// exchange drops what no queue is bound to.
func TestAMQP_QueueDeclaredBeforeFirstPublish(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := uniqueTopic("early")
	group := "billing-" + runID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	producer := newBackend(t, backends.Config{URL: url, Group: group, AMQP: backends.AMQPConfig{PublishGroups: []string{group}}})
	publish(t, producer.Publisher, topic, "early")
	require.NoError(t, producer.Close())

	consumer := newBackend(t, backends.Config{URL: url, Group: group})
	msgs := subscribe(t, consumer, topic)
	assert.Equal(t, "early", receive(t, msgs))
}

// Without PublishGroups, a publish before any group subscribed to the topic
// has no queue to go to: an ErrUnroutable, not a silent drop.
func TestAMQP_PublishBeforeAnyGroupIsAnError(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := uniqueTopic("nobody")
	group := "billing-" + runID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })

	producer := newBackend(t, backends.Config{URL: url, Group: group})
	require.ErrorIs(t, producer.Publisher.Publish(topic, newMessage("early")), backends.ErrUnroutable)
}

// Within a group AMQP consumers compete; across groups each gets every
// message.
func TestAMQP_GroupsFanOut(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := uniqueTopic("fanout")
	a, b := "a-"+runID, "b-"+runID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{a, b}) })

	pub := newBackend(t, backends.Config{URL: url, Group: a, AMQP: backends.AMQPConfig{PublishGroups: []string{a, b}}})
	publish(t, pub.Publisher, topic, "m")

	for _, g := range []string{a, b} {
		sub := newBackend(t, backends.Config{URL: url, Group: g})
		msgs := subscribe(t, sub, topic)
		assert.Equal(t, "m", receive(t, msgs), "group %s", g)
	}
}

// A Redis Streams subscriber must use the configured, stable consumer name,
// not a random one per process.
func TestRedisStreams_StableConsumerName(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	topic := uniqueTopic("stable")
	group := "billing-" + runID
	t.Cleanup(func() { _ = rdb.Del(context.Background(), topic).Err() })

	for range 2 { // a restart
		b := newBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group, Consumer: "pod-7f9c"})
		msgs := subscribe(t, b, topic)
		publish(t, b.Publisher, topic, "x")
		assert.Equal(t, "x", receive(t, msgs))
		require.NoError(t, b.Close())
	}
	consumers, err := rdb.XInfoConsumers(context.Background(), topic, group).Result()
	require.NoError(t, err)
	require.Len(t, consumers, 1)
	assert.Equal(t, "pod-7f9c", consumers[0].Name)
}

// Kafka topics are created by the backend (the in-process cluster has auto
// creation off) with the configured partitions and, by default, a
// replication factor of min(3, brokers).
func TestKafka_CreatesTopics(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t, testserver.KafkaOptions{Brokers: 3, Partitions: 8})
	if len(brokers) < 3 {
		t.Skip("KAFKA_BROKERS names fewer than 3 brokers; this test checks the replication default on 3")
	}
	topic := uniqueTopic("created")
	b := newBackend(t, backends.Config{
		URL:   "kafka://" + strings.Join(brokers, ","),
		Group: "billing-" + runID,
		Kafka: backends.KafkaConfig{Partitions: 5},
	})
	publish(t, b.Publisher, topic, "first")
	msgs := subscribe(t, b, topic)
	assert.Equal(t, "first", receive(t, msgs), "a new group starts at the oldest offset")

	meta := describeTopic(t, brokers, topic)
	assert.Len(t, meta.Partitions, 5)
	for _, p := range meta.Partitions {
		assert.Len(t, p.Replicas, 3)
	}
}

// Topics created without Kafka.Partitions get 12, not the broker's 1: with
// one partition a single failing message holds back the whole topic, and a
// group cannot have more than one active consumer. The in-process cluster's
// own default is 8, so 12 can only come from the backend.
func TestKafka_DefaultPartitions(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t, testserver.KafkaOptions{Partitions: 8})
	topic := uniqueTopic("default-partitions")
	b := newBackend(t, backends.Config{URL: "kafka://" + strings.Join(brokers, ","), Group: "billing-" + runID})
	require.NoError(t, b.Subscriber.(message.SubscribeInitializer).SubscribeInitialize(topic))

	assert.Len(t, describeTopic(t, brokers, topic).Partitions, 12, "the default partition count of a created topic")
}

// describeTopic returns what the Kafka cluster of brokers knows of topic.
func describeTopic(t *testing.T, brokers []string, topic string) *sarama.TopicMetadata {
	t.Helper()
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(brokers, conf)
	require.NoError(t, err)
	defer admin.Close()
	meta, err := admin.DescribeTopics([]string{topic})
	require.NoError(t, err)
	require.Len(t, meta, 1)
	require.Equal(t, sarama.ErrNoError, meta[0].Err, "topic %s", topic)
	return meta[0]
}

// Kafka redelivers a nacked message after NackResendSleep, and the one behind
// it in its partition waits. One partition, so that both are in it.
func TestKafka_NackRedelivers(t *testing.T) {
	t.Parallel()
	brokers := testserver.KafkaBrokers(t)
	topic := uniqueTopic("nack")
	b := newBackend(t, backends.Config{URL: "kafka://" + strings.Join(brokers, ","), Group: "g-" + runID,
		NackResendSleep: 100 * time.Millisecond, Kafka: backends.KafkaConfig{Partitions: 1}})
	publish(t, b.Publisher, topic, "a", "b")
	msgs := subscribe(t, b, topic)
	m := <-msgs
	require.Equal(t, "a", string(m.Payload))
	m.Nack()
	assert.Equal(t, "a", receive(t, msgs))
	assert.Equal(t, "b", receive(t, msgs))
}

// gochannel is one shared, persistent instance: a subscriber that comes late
// still gets what was published.
func TestGoChannel_SharedPersistent(t *testing.T) {
	t.Parallel()
	b := newBackend(t, backends.Config{URL: "gochannel://"})
	publish(t, b.Publisher, "orders", "early")
	msgs := subscribe(t, b, "orders")
	assert.Equal(t, "early", receive(t, msgs))
}

// A nack on gochannel (and AMQP) is held for NackResendSleep instead of
// spinning.
func TestGoChannel_NackIsDelayed(t *testing.T) {
	t.Parallel()
	b := newBackend(t, backends.Config{URL: "gochannel://", NackResendSleep: 300 * time.Millisecond})
	msgs := subscribe(t, b, "orders")
	publish(t, b.Publisher, "orders", "x")
	m := <-msgs
	m.Nack()
	nothingFor(t, msgs, 100*time.Millisecond)
	assert.Equal(t, "x", receive(t, msgs))
}

func newMessage(payload string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(payload))
}
