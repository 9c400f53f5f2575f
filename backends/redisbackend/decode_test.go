package redisbackend_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Stream entries that watermill-redisstream cannot unmarshal (added by
// another program: no UUID field, metadata that is not msgpack) reach the
// handler, and the messages after them too. The library stopped reading
// the stream at the first of them, with one log line.
func TestRedisStreams_UndecodableEntryIsHandedOn(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	topic := backendtest.UniqueTopic("undecodable")
	t.Cleanup(func() { _ = rdb.Del(context.Background(), topic).Err() })
	b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: "billing-" + backendtest.RunID})

	ctx := context.Background()
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{"payload": "no uuid"}}).Err())
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: map[string]any{
		"_watermill_message_uuid": "u-2", "payload": "bad metadata", "metadata": "\xc1not msgpack"}}).Err())
	backendtest.Publish(t, b.Publisher, topic, "after")
	msgs := backendtest.Subscribe(t, b, topic)

	first := backendtest.Next(t, msgs)
	assert.Equal(t, "no uuid", string(first.Payload))
	assert.Empty(t, first.UUID)
	first.Ack()
	second := backendtest.Next(t, msgs)
	assert.Equal(t, "bad metadata", string(second.Payload))
	assert.Equal(t, "u-2", second.UUID)
	assert.NotEmpty(t, second.Metadata.Get(backends.MetadataUndecodable), "says what was left out")
	second.Ack()
	assert.Equal(t, "after", backendtest.Receive(t, msgs))
}
