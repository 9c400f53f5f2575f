package redisbackend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// A message that keeps failing stays with the Redis Streams consumer that
// holds it, and the group's other consumer handles the healthy messages.
// Before, the nacked message was resent in process, its idle time grew, the
// other consumer claimed it after MaxIdleTime and looped on it too, and the
// healthy messages waited behind both loops.
func TestRedisStreams_FailingMessageStaysWithItsConsumer(t *testing.T) {
	t.Parallel()
	const maxIdle = time.Second
	addr := testserver.RedisAddr(t)
	topic := backendtest.UniqueTopic("poison")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { _ = testserver.RedisClient(t).Del(context.Background(), topic).Err() })

	var mu sync.Mutex
	poisonedAt := map[string]bool{}
	healthy := map[string]bool{}
	for _, consumer := range []string{"pod-1", "pod-2"} {
		b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams("redis://"+addr+"/0", "max_idle_time", maxIdle.String(), "claim_interval", "200ms"), Group: group, Consumer: consumer,
			NackResendSleep: 100 * time.Millisecond})
		msgs := backendtest.Subscribe(t, b, topic)
		go func() {
			for m := range msgs {
				mu.Lock()
				if string(m.Payload) == "poison" {
					poisonedAt[consumer] = true
					mu.Unlock()
					m.Nack()
					continue
				}
				healthy[string(m.Payload)] = true
				mu.Unlock()
				m.Ack()
			}
		}()
	}
	pub := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group, Consumer: "publisher"})
	backendtest.Publish(t, pub.Publisher, topic, "poison")
	// Long enough for the other consumer to claim the poison message if
	// its idle time grew: MaxIdleTime, twice, and the claim interval.
	time.Sleep(2*maxIdle + 500*time.Millisecond)

	start := time.Now()
	want := []string{"h1", "h2", "h3", "h4", "h5", "h6"}
	backendtest.Publish(t, pub.Publisher, topic, want...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(healthy)
		mu.Unlock()
		if n == len(want) {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("%d of %d healthy messages handled in 20 s beside one failing message (held by %v)",
				n, len(want), poisonedAt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d healthy messages handled in %v while one message failed", len(want), time.Since(start).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, poisonedAt, 1, "the failing message stays with one consumer: %v", poisonedAt)
}

// A failing message stays with its consumer when NackResendSleep is longer
// than MaxIdleTime too: the nacked entry is refreshed while it waits out the
// sleep. Before, it was refreshed once per nack, then sat idle for the whole
// NackResendSleep, and another consumer claimed it and looped on it as well.
func TestRedisStreams_FailingMessageStaysWithItsConsumerThroughALongNackSleep(t *testing.T) {
	t.Parallel()
	const maxIdle = 300 * time.Millisecond
	addr := testserver.RedisAddr(t)
	topic := backendtest.UniqueTopic("poison-long-sleep")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { _ = testserver.RedisClient(t).Del(context.Background(), topic).Err() })

	var mu sync.Mutex
	nacks := map[string]int{}
	for _, consumer := range []string{"pod-1", "pod-2"} {
		b := backendtest.NewBackend(t, backends.Config{URL: backendtest.WithParams("redis://"+addr+"/0", "max_idle_time", maxIdle.String(), "claim_interval", "50ms"), Group: group, Consumer: consumer,
			NackResendSleep: 4 * maxIdle})
		msgs := backendtest.Subscribe(t, b, topic)
		go func() {
			for m := range msgs {
				mu.Lock()
				nacks[consumer]++
				mu.Unlock()
				m.Nack()
			}
		}()
	}
	pub := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group, Consumer: "publisher"})
	backendtest.Publish(t, pub.Publisher, topic, "poison")
	// Four deliveries: three nack sleeps, each four times MaxIdleTime.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		total := nacks["pod-1"] + nacks["pod-2"]
		mu.Unlock()
		if total >= 4 {
			break
		}
		require.False(t, time.Now().After(deadline), "the failing message was not redelivered: %v", nacks)
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, nacks, 1, "the failing message stays with one consumer: %v", nacks)
}

// recreatedWithin bounds the wait for a message after a stream or group was
// deleted: the subscriber recovers at its next read; the bound only fails a
// subscriber that never does.
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

// A stream deleted (DEL) under a running subscriber takes its consumer
// group with it. The next XADD creates the stream without the group; the
// subscriber, refused with NOGROUP, creates the group again and reads on.
// Before, it retried the read for ever and the message waited.
func TestRedisStreams_SubscriberRecreatesDeletedGroup(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	ctx := context.Background()
	topic := backendtest.UniqueTopic("deleted")
	other := backendtest.UniqueTopic("kept")
	t.Cleanup(func() { _ = rdb.Del(ctx, topic, other).Err() })
	b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: "billing-" + backendtest.RunID})
	msgs := backendtest.Subscribe(t, b, topic)
	otherMsgs := backendtest.Subscribe(t, b, other)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	require.NoError(t, rdb.Del(ctx, topic).Err())
	backendtest.Publish(t, b.Publisher, topic, "two")
	assert.Equal(t, "two", receiveWithin(t, msgs, recreatedWithin), "the first message in the new stream")
	backendtest.Publish(t, b.Publisher, topic, "three")
	assert.Equal(t, "three", backendtest.Receive(t, msgs))
	backendtest.Publish(t, b.Publisher, other, "other")
	assert.Equal(t, "other", backendtest.Receive(t, otherMsgs), "a stream of the same subscriber left alone")
}

// A group destroyed alone (XGROUP DESTROY), its stream kept, is created
// again too, at the start of the stream: the group reads the stream again,
// as a new group does, and nothing is skipped (the idempotency middleware
// acks what it completed before as duplicates).
func TestRedisStreams_SubscriberRecreatesDestroyedGroup(t *testing.T) {
	t.Parallel()
	addr := testserver.RedisAddr(t)
	rdb := testserver.RedisClient(t)
	ctx := context.Background()
	topic := backendtest.UniqueTopic("destroyed")
	group := "billing-" + backendtest.RunID
	t.Cleanup(func() { _ = rdb.Del(ctx, topic).Err() })
	b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group})
	msgs := backendtest.Subscribe(t, b, topic)
	backendtest.Publish(t, b.Publisher, topic, "one")
	assert.Equal(t, "one", backendtest.Receive(t, msgs))

	require.NoError(t, rdb.XGroupDestroy(ctx, topic, group).Err())
	backendtest.Publish(t, b.Publisher, topic, "two")
	assert.Equal(t, "one", receiveWithin(t, msgs, recreatedWithin), "the stream again from its start")
	assert.Equal(t, "two", backendtest.Receive(t, msgs))
}
