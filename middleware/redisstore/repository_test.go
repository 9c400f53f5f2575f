package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

func TestExpiringKeyRepository(t *testing.T) {
	client := testserver.RedisClient(t)
	prefix := "repo-test:" + watermill.NewShortUUID() + ":"
	repo, err := redisstore.NewExpiringKeyRepository(client, prefix, 300*time.Millisecond)
	require.NoError(t, err)
	ctx := context.Background()

	dup, err := repo.IsDuplicate(ctx, "a")
	require.NoError(t, err)
	assert.False(t, dup, "first sight is not a duplicate")
	dup, err = repo.IsDuplicate(ctx, "a")
	require.NoError(t, err)
	assert.True(t, dup, "second sight within the window is a duplicate")
	dup, err = repo.IsDuplicate(ctx, "b")
	require.NoError(t, err)
	assert.False(t, dup)

	time.Sleep(400 * time.Millisecond)
	dup, err = repo.IsDuplicate(ctx, "a")
	require.NoError(t, err)
	assert.False(t, dup, "after the window the key is new again")

	_, err = redisstore.NewExpiringKeyRepository(client, prefix, 0)
	assert.Error(t, err)
}

// TestWatermillDeduplicatorAcrossRouters plugs the repository into
// Watermill's own Deduplicator in two routers that each receive every copy:
// each distinct message is handled once in all.
func TestWatermillDeduplicatorAcrossRouters(t *testing.T) {
	client := testserver.RedisClient(t)
	repo, err := redisstore.NewExpiringKeyRepository(client, "repo-test:"+watermill.NewShortUUID()+":", time.Minute)
	require.NoError(t, err)

	const distinct, copies = 50, 3
	var handled atomic.Int32
	var seen sync.Map
	var pubs []message.Publisher
	for r := range 2 {
		pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		dedup := &wmmiddleware.Deduplicator{
			KeyFactory: wmmiddleware.NewMessageHasherFromMetadataField("requestId"),
			Repository: repo,
			// A zero Timeout in a Deduplicator literal becomes 5 ms, which a
			// client with ContextTimeoutEnabled takes literally: a SET cut
			// short after Redis applied it marks the key, and the message
			// redelivered is then dropped as a duplicate of itself.
			Timeout: 5 * time.Second,
		}
		router.AddMiddleware(dedup.Middleware)
		router.AddConsumerHandler("h", "topic", pubSub, func(msg *message.Message) error {
			handled.Add(1)
			if _, loaded := seen.LoadOrStore(msg.Metadata.Get("requestId"), r); loaded {
				t.Errorf("request %s handled twice", msg.Metadata.Get("requestId"))
			}
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		go func() { _ = router.Run(ctx) }()
		<-router.Running()
		t.Cleanup(func() { cancel(); _ = router.Close(); _ = pubSub.Close() })
		pubs = append(pubs, pubSub)
	}
	for i := range distinct {
		for c := range copies {
			msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
			msg.Metadata.Set("requestId", "req-"+strconv.Itoa(i))
			require.NoError(t, pubs[(i+c)%2].Publish("topic", msg))
		}
	}
	require.Eventually(t, func() bool { return handled.Load() == distinct }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	assert.EqualValues(t, distinct, handled.Load(), "each distinct request handled once across both routers")
}
