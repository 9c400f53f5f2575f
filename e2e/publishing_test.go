package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// publishing is the scenario's side of the broker: its publisher, and the
// record of what it published, which must end acked.
type publishing struct {
	pub message.Publisher

	mu sync.Mutex
	// groups are the messages that must end acked: at least one message of
	// each group, by metaID. Every group is one message: no broker drops a
	// copy that repeats a UUID (the NATS backend sends no Nats-Msg-Id).
	groups    map[string][]string
	expected  map[string]bool // metaID of every published or produced message
	published int
	pubWG     sync.WaitGroup
	pubErr    atomic.Value

	// publishFailed counts the publishes of produced messages that failed
	// on purpose (output-replay): their runs end nacked, not acked.
	publishFailed atomic.Int64
}

func newPublishing() publishing {
	return publishing{groups: map[string][]string{}, expected: map[string]bool{}}
}

// publishWith makes a new member, named member, the scenario's publisher;
// it is closed at the end.
func (e *env) publishWith(member string) {
	pb := e.backend(member)
	e.t.Cleanup(func() { _ = pb.Close() })
	e.pub = pb.Publisher
}

// newMsg is copy n of key, with the given UUID.
func newMsg(key string, n int, uuid string) *message.Message {
	m := message.NewMessage(uuid, []byte("payload of "+key))
	m.Metadata.Set("requestId", key)
	m.Metadata.Set(metaID, fmt.Sprintf("%s#%d", key, n))
	m.Metadata.Set(metaEffect, "up/"+key)
	return m
}

// oneCopyEach is copy 0 of each key, each with a UUID of its own.
func oneCopyEach(keys []string) []*message.Message {
	msgs := make([]*message.Message, 0, len(keys))
	for _, k := range keys {
		msgs = append(msgs, newMsg(k, 0, watermill.NewUUID()))
	}
	return msgs
}

// expect registers msg as one that must end acked.
func (e *env) expect(msg *message.Message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.published++
	id := msg.Metadata.Get(metaID)
	e.groups[id] = append(e.groups[id], id)
	e.expected[id] = true
}

// expectID registers a message that the handlers themselves produce.
func (e *env) expectID(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.groups[id] = append(e.groups[id], id)
	e.expected[id] = true
}

// publish publishes msgs from several goroutines, as a fleet of producers
// would, and returns once they are all published.
func (e *env) publish(msgs ...*message.Message) {
	e.t.Helper()
	for _, m := range msgs {
		e.expect(m)
	}
	const workers = 8
	next := make(chan *message.Message)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range next {
				e.publishOne(m)
			}
		}()
	}
	for _, m := range msgs {
		next <- m
	}
	close(next)
	wg.Wait()
	e.requirePublished()
}

// publishPaced publishes msgs one every gap, in the background.
func (e *env) publishPaced(gap time.Duration, msgs ...*message.Message) {
	e.publishInBackground(msgs, func(m *message.Message) {
		e.publishOne(m)
		time.Sleep(gap)
	})
}

// publishInBackground registers msgs and publishes each with publish, one
// after another, in the background; the accounting waits for it.
func (e *env) publishInBackground(msgs []*message.Message, publish func(m *message.Message)) {
	for _, m := range msgs {
		e.expect(m)
	}
	e.pubWG.Add(1)
	go func() {
		defer e.pubWG.Done()
		for _, m := range msgs {
			publish(m)
		}
	}()
}

func (e *env) publishOne(m *message.Message) {
	if err := e.pub.Publish(e.topic, m); err != nil {
		e.pubErr.CompareAndSwap(nil, fmt.Errorf("publish %s: %w", m.Metadata.Get(metaID), err))
	}
}

// requirePublished fails the test if a publish failed.
func (e *env) requirePublished() {
	e.t.Helper()
	if err, _ := e.pubErr.Load().(error); err != nil {
		e.t.Fatal(err)
	}
}
