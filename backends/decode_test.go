package backends_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// next returns the next message within 15 s.
func next(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-msgs:
		require.NotNil(t, m, "channel closed")
		return m
	case <-time.After(15 * time.Second):
		t.Fatal("no message within 15 s")
		return nil
	}
}

// Stream entries that watermill-redisstream cannot unmarshal (added by
// another program: no UUID field, metadata that is not msgpack) reach the
// handler, and the messages after them too. The library stopped reading
// the stream at the first of them, with one log line.
func TestRedisStreams_UndecodableEntryIsHandedOn(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	topic := uniqueTopic("undecodable")
	t.Cleanup(func() { _ = rdb.Del(context.Background(), topic).Err() })
	b := newBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: "billing-" + runID})

	ctx := context.Background()
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"payload": "no uuid"}}).Err())
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{
		"_watermill_message_uuid": "u-2", "payload": "bad metadata", "metadata": "\xc1not msgpack"}}).Err())
	publish(t, b.Publisher, topic, "after")
	msgs := subscribe(t, b, topic)

	first := next(t, msgs)
	assert.Equal(t, "no uuid", string(first.Payload))
	assert.Empty(t, first.UUID)
	first.Ack()
	second := next(t, msgs)
	assert.Equal(t, "bad metadata", string(second.Payload))
	assert.Equal(t, "u-2", second.UUID)
	assert.NotEmpty(t, second.Metadata.Get(backends.MetadataUndecodable), "says what was left out")
	second.Ack()
	assert.Equal(t, "after", receive(t, msgs))
}

// An AMQP message with a header that is not a string (another producer's
// number, RabbitMQ's x-death table) reaches the handler with the header
// formatted. watermill-amqp nacked it with requeue before any handler saw
// it, and RabbitMQ handed it straight back, in a loop without end.
func TestAMQP_NonStringHeaderIsHandedOn(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	topic := uniqueTopic("headers")
	group := "billing-" + runID
	t.Cleanup(func() { testserver.DeleteAMQP(t, url, []string{topic}, []string{group}) })
	b := newBackend(t, backends.Config{URL: url, Group: group})
	msgs := subscribe(t, b, topic)

	amqpAdmin(t, url, func(ch *amqp091.Channel) {
		require.NoError(t, ch.PublishWithContext(context.Background(), topic, "", false, false, amqp091.Publishing{
			Headers: amqp091.Table{"_watermill_message_uuid": "u-1", "count": int32(3), "requestId": "order-7"},
			Body:    []byte("foreign"),
		}))
	})
	publish(t, b.Publisher, topic, "after")

	m := next(t, msgs)
	assert.Equal(t, "foreign", string(m.Payload))
	assert.Equal(t, "u-1", m.UUID)
	assert.Equal(t, "3", m.Metadata.Get("count"))
	assert.Equal(t, "order-7", m.Metadata.Get("requestId"))
	m.Ack()
	assert.Equal(t, "after", receive(t, msgs))
}
