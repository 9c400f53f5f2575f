package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// counters count what happens while the scenario runs: deliveries and how
// the router settled them (tracker), the middleware's outcomes and store
// calls (observer), and the handler runs.
type counters struct {
	obs  *observer
	tr   *tracker
	runs atomic.Int64
}

// tally counts events by name; it is safe for concurrent use.
type tally[K comparable] struct {
	mu sync.Mutex
	n  map[K]int
}

// add counts one more k and returns how many there are now.
func (c *tally[K]) add(k K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[K]int{}
	}
	c.n[k]++
	return c.n[k]
}

func (c *tally[K]) get(k K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// all is a copy of every count, taken at one moment.
func (c *tally[K]) all() map[K]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	all := make(map[K]int, len(c.n))
	for k, v := range c.n {
		all[k] = v
	}
	return all
}

// observer is the consumers' Observer: it counts the middleware's outcomes,
// the store calls that succeeded and those that failed.
type observer struct {
	outcomes tally[idempotency.Outcome]
	ops      tally[string]
	failed   tally[string]
}

func newObserver() *observer { return &observer{} }

func (o *observer) CacheLookup(string, bool) {}

func (o *observer) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	o.outcomes.add(d.Outcome)
}

func (o *observer) StoreLatency(op string, _ time.Duration, err error) {
	if err == nil {
		o.ops.add(op)
		return
	}
	o.failed.add(op)
}

func (o *observer) get(outcome idempotency.Outcome) int { return o.outcomes.get(outcome) }

// op is how many store calls of op succeeded.
func (o *observer) op(op string) int { return o.ops.get(op) }

// failedOps is how many store calls failed, by operation.
func (o *observer) failedOps() map[string]int { return o.failed.all() }

// tracker is the outermost middleware of every consumer: it counts
// deliveries and watches each message until the router acks or nacks it.
type tracker struct {
	e                        *env
	stop                     chan struct{}
	deliveries, acks, nacks  atomic.Int64
	ackedEarly               atomic.Int64
	mu                       sync.Mutex
	delivered, acked, earlyM map[string]int
}

func newTracker(e *env) *tracker {
	return &tracker{e: e, stop: make(chan struct{}),
		delivered: map[string]int{}, acked: map[string]int{}, earlyM: map[string]int{}}
}

func (tr *tracker) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id := msg.Metadata.Get(metaID)
		tr.mu.Lock()
		tr.delivered[id]++
		tr.mu.Unlock()
		tr.deliveries.Add(1)
		go tr.watch(msg, id, msg.Metadata.Get(metaEffect))
		return h(msg)
	}
}

// watch counts how the router settles msg. The router settles every
// message it hands to a handler, once the handler returns.
func (tr *tracker) watch(msg *message.Message, id, effect string) {
	select {
	case <-msg.Acked():
		if _, ok := tr.e.effects.Load(effect); !ok {
			tr.ackedEarly.Add(1)
			tr.mu.Lock()
			tr.earlyM[id]++
			tr.mu.Unlock()
		}
		tr.mu.Lock()
		tr.acked[id]++
		tr.mu.Unlock()
		tr.acks.Add(1)
	case <-msg.Nacked():
		tr.nacks.Add(1)
	case <-tr.stop:
	}
}

// state returns the counters and the expected messages not acked yet.
func (tr *tracker) state() (deliveries, acks, nacks int64, missing []string) {
	// Settled counters first: a delivery counted after them can only make
	// deliveries larger, never hide an unsettled one.
	acks, nacks = tr.acks.Load(), tr.nacks.Load()
	deliveries = tr.deliveries.Load()
	tr.e.mu.Lock()
	defer tr.e.mu.Unlock()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	need := max(1, int(tr.e.fanout.Load()))
groups:
	for _, ids := range tr.e.groups {
		for _, id := range ids {
			if tr.acked[id] >= need {
				continue groups
			}
		}
		missing = append(missing, strings.Join(ids, "|"))
	}
	return deliveries, acks, nacks, missing
}

// deliveredTimes is how often the message id was delivered.
func (tr *tracker) deliveredTimes(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.delivered[id]
}

// detail describes, for a failure message, how the missing messages and
// those acked more than once or unexpectedly were delivered.
func (tr *tracker) detail(missing []string) string {
	tr.e.mu.Lock()
	defer tr.e.mu.Unlock()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	for _, group := range first(missing, 10) {
		for _, id := range strings.Split(group, "|") {
			fmt.Fprintf(&b, "missing %s delivered %d; ", id, tr.delivered[id])
		}
	}
	n := 0
	for id, c := range tr.acked {
		if (c > 1 || !tr.e.expected[id]) && n < 10 {
			n++
			fmt.Fprintf(&b, "%s delivered %d acked %d; ", id, tr.delivered[id], c)
		}
	}
	return b.String()
}

// early lists some of the messages acked before their key's effect.
func (tr *tracker) early() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var ids []string
	for id := range tr.earlyM {
		ids = append(ids, id)
	}
	return first(ids, 5)
}

// snapshot is the counters at one moment.
type snapshot struct {
	deliveries, acks, nacks, runs int64
	outcomes                      map[idempotency.Outcome]int
	missing                       []string
}

// settled takes a consistent snapshot and reports whether the run is over:
// every expected message acked (by every consumer, on gochannel), every
// delivery acked or nacked.
func (e *env) settled() (snapshot, bool) {
	read := func() snapshot {
		s := snapshot{runs: e.runs.Load(), outcomes: e.obs.outcomes.all()}
		s.deliveries, s.acks, s.nacks, s.missing = e.tr.state()
		return s
	}
	a := read()
	if len(a.missing) > 0 || a.deliveries != a.acks+a.nacks {
		return a, false
	}
	// A delivery could have slipped in between the counters; read again.
	b := read()
	return b, a.deliveries == b.deliveries && a.acks == b.acks && a.runs == b.runs
}

// first is the first n of s, sorted.
func first(s []string, n int) []string {
	sort.Strings(s)
	if len(s) > n {
		return s[:n]
	}
	return s
}
