package brokeradmin_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/amqpname"
	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// TestDeleteNATSStreams deletes the stream of one topic and skips a topic
// that no stream captures.
func TestDeleteNATSStreams(t *testing.T) {
	url := testserver.NATSURL(t)
	topic := testserver.UniqueName("brokeradmin")
	js, closeConn, err := brokeradmin.JetStream(url)
	require.NoError(t, err)
	defer closeConn()
	_, err = js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic}})
	require.NoError(t, err)

	require.NoError(t, brokeradmin.DeleteNATSStreams(url, topic, topic+"-none"))
	_, err = js.StreamInfo(topic)
	assert.ErrorIs(t, err, nats.ErrStreamNotFound)

	_, _, err = brokeradmin.JetStream("nats://127.0.0.1:1")
	assert.Error(t, err, "a server that does not answer")
}

// TestDeleteAMQP deletes the queue of each topic and group (a group with '_'
// too) and the topic's
// exchange; what does not exist is no error.
func TestDeleteAMQP(t *testing.T) {
	url := testserver.RabbitMQURL(t)
	topic := testserver.UniqueName("brokeradmin")
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(topic, "fanout", true, false, false, false, nil))
	queues := []string{amqpname.Queue(topic, "a"), amqpname.Queue(topic, "b_c")}
	for _, q := range queues {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}

	require.NoError(t, brokeradmin.DeleteAMQP(url, []string{topic, topic + "-none"}, []string{"a", "b_c", "c"}))
	for _, q := range queues {
		_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		require.Error(t, err, "queue %s is gone", q)
		if ch, err = conn.Channel(); err != nil { // a failed passive declare closes the channel
			t.Fatal(err)
		}
	}
	assert.Error(t, ch.ExchangeDeclarePassive(topic, "fanout", true, false, false, false, nil), "exchange is gone")

	assert.Error(t, brokeradmin.DeleteAMQP("amqp://guest:guest@127.0.0.1:1/", []string{topic}, nil), "a server that does not answer")
}
