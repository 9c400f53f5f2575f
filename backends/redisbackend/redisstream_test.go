package redisbackend_test

import (
	"context"
	"sync"
	"testing"
	"time"

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
		b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group, Consumer: consumer,
			NackResendSleep: 100 * time.Millisecond,
			Redis:           backends.RedisConfig{MaxIdleTime: maxIdle, ClaimInterval: 200 * time.Millisecond}})
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
		b := backendtest.NewBackend(t, backends.Config{URL: "redis://" + addr + "/0", Group: group, Consumer: consumer,
			NackResendSleep: 4 * maxIdle,
			Redis:           backends.RedisConfig{MaxIdleTime: maxIdle, ClaimInterval: 50 * time.Millisecond}})
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
