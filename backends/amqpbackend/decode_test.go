package amqpbackend_test

import (
	"context"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// An AMQP message with a header that is not a string (another producer's
// number, RabbitMQ's x-death table) reaches the handler with the header
// formatted. watermill-amqp nacked it with requeue before any handler saw
// it, and RabbitMQ handed it straight back, in a loop without end.
func TestAMQP_NonStringHeaderIsHandedOn(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := backendtest.UniqueTopic("headers")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })
	b := backendtest.NewBackend(t, backends.Config{URL: url, Group: group})
	msgs := backendtest.Subscribe(t, b, topic)

	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		require.NoError(t, ch.PublishWithContext(context.Background(), topic, "", false, false, amqp091.Publishing{
			Headers: amqp091.Table{"_watermill_message_uuid": "u-1", "count": int32(3), "requestId": "order-7"},
			Body:    []byte("foreign"),
		}))
	})
	backendtest.Publish(t, b.Publisher, topic, "after")

	m := backendtest.Next(t, msgs)
	assert.Equal(t, "foreign", string(m.Payload))
	assert.Equal(t, "u-1", m.UUID)
	assert.Equal(t, "3", m.Metadata.Get("count"))
	assert.Equal(t, "order-7", m.Metadata.Get("requestId"))
	m.Ack()
	assert.Equal(t, "after", backendtest.Receive(t, msgs))
}
