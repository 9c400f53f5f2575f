package e2e

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
)

var errStuck = errors.New("stuck handler failed on purpose")

// stuckPartition (Kafka): topics get the backends' default partition count,
// and one key's handler fails on every delivery, so its message is nacked
// and resent over and over, holding back its partition. The messages of 120
// other keys, on the other partitions, must each be processed exactly once
// meanwhile; a message published behind the stuck one in its partition must
// wait for it, through at least five failures of the stuck one. Then the
// stuck key's handler is allowed to succeed, and everything settles.
//
// The backends publish without a partition key, so sarama's default
// partitioner places each message on a random partition: whether another
// key landed behind the stuck one would be chance. The publisher here uses
// pinnedPartitioner instead, which puts the stuck key and one key behind it
// on partition 0 and spreads the others over the rest by a hash of their
// key, so the run is the same every time. It uses the partition count of
// the topic as created; with a single partition (the default before issue
// 11) every key lands behind the stuck one and the scenario fails at once.
func stuckPartition(e *env) {
	const n, consumers = 120, 2
	keys := keyNames("p", n)
	stuck, behind := "p-stuck", "p-behind"
	e.expectEffects("up", append([]string{stuck, behind}, keys...))
	part := newPinnedPartitioner(stuck, behind)
	e.configure = func(cfg *backends.Config) {
		setParam(cfg, "kafka", "partitions", "") // the backends' default is under test
		cfg.Tune = func(client any) {
			kafkaTune(client)
			if c, ok := client.(*sarama.Config); ok {
				c.Producer.Partitioner = func(string) sarama.Partitioner { return part }
			}
		}
	}
	e.publishWith("pinned-publisher")

	var released atomic.Bool
	var stuckRuns atomic.Int64
	e.handle(consumers, func(msg *message.Message) error {
		e.runs.Add(1)
		key := msg.Metadata.Get("requestId")
		if key == stuck && !released.Load() {
			stuckRuns.Add(1)
			return errStuck
		}
		return e.effect(msg, "up", key)
	})
	e.publish(newMsg(stuck, 0, watermill.NewUUID()))
	e.publish(newMsg(behind, 0, watermill.NewUUID()))
	require.Greater(e.t, part.partitions(), int32(1),
		"topics are created with more than one partition by default: with one, a failing message stalls the whole topic")
	e.waitFor("the stuck key failing", func() bool { return stuckRuns.Load() > 0 })
	e.publish(oneCopyEach(keys)...)

	// The stuck message is resent and fails again every NackResendSleep;
	// a few rounds show that its partition stays held across redeliveries.
	e.waitFor("every key on the other partitions processed while one keeps failing", func() bool {
		return stuckRuns.Load() >= 5 && e.haveEffects("up", keys...)
	})
	failed := stuckRuns.Load()
	behindDone := e.haveEffects("up", behind)
	released.Store(true)
	e.note = func() string {
		return fmt.Sprintf("%d partitions, the stuck key failed %d times before it was let through", part.partitions(), failed)
	}
	e.requireExactlyOnce(func(t assert.TestingT) {
		assert.False(t, behindDone, "the message behind the failing one in its partition waited for it, %d failures long", failed)
		used := part.used(keys...)
		assert.NotContains(t, used, int32(0), "no other key shares the stuck key's partition")
		assert.Len(t, used, int(part.partitions())-1, "the other keys are spread over every other partition")
	})
}

// pinnedPartitioner places the messages of the pinned keys (metadata
// requestId) on partition 0 and those of every other key on partitions 1 to
// n-1, by an FNV hash of the key. It records the partition count it was
// given, which is the topic's.
type pinnedPartitioner struct {
	pinned map[string]bool

	mu       sync.Mutex
	count    int32
	assigned map[string]int32
}

var _ sarama.Partitioner = (*pinnedPartitioner)(nil)

func newPinnedPartitioner(keys ...string) *pinnedPartitioner {
	p := &pinnedPartitioner{pinned: map[string]bool{}, assigned: map[string]int32{}}
	for _, k := range keys {
		p.pinned[k] = true
	}
	return p
}

func (p *pinnedPartitioner) Partition(m *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	var key string
	for _, h := range m.Headers {
		if string(h.Key) == "requestId" {
			key = string(h.Value)
		}
	}
	var partition int32
	if !p.pinned[key] && numPartitions > 1 {
		partition = 1 + int32(fnvMod(key, uint32(numPartitions-1)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.count = numPartitions
	p.assigned[key] = partition
	return partition, nil
}

// RequiresConsistency is true: a message must never be moved to another
// partition than the one chosen for its key.
func (p *pinnedPartitioner) RequiresConsistency() bool { return true }

// partitions is the partition count of the topic at the last publish.
func (p *pinnedPartitioner) partitions() int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

// used lists the distinct partitions the messages of keys went to.
func (p *pinnedPartitioner) used(keys ...string) []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[int32]bool{}
	var out []int32
	for _, k := range keys {
		if part, ok := p.assigned[k]; ok && !seen[part] {
			seen[part] = true
			out = append(out, part)
		}
	}
	return out
}
