package e2e

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return keys
}

// effectOnce is the plain handler: count the run, record the effect.
func (e *env) effectOnce(msg *message.Message) error {
	e.runs.Add(1)
	return e.effect(msg, "up", msg.Metadata.Get("requestId"))
}

// duplicateStorm: 1,000 keys, 5 copies each, in random order, to 4
// competing consumers. Copies 0-2 of a key share a UUID (a producer
// retrying), copies 3 and 4 have their own (another producer, same
// requestId); every broker delivers every copy. On the pg- and mysql-
// columns, 500 keys, each effect made in the handler's transaction. Every
// column starts with it, all at once: the 5,000 deliveries of each keep
// every consumer contending for the same keys throughout, and twice as
// many would only make the run longer.
func duplicateStorm(e *env) {
	const copies, consumers = 5, 4
	n := e.size(1000, 2)
	keys := keyNames("k", n)
	e.expectEffects("up", keys)
	e.handle(consumers, e.effectOnce)

	seed := time.Now().UnixNano()
	var msgs []*message.Message
	for _, k := range keys {
		shared := watermill.NewUUID()
		for c := range copies {
			uuid := shared
			if c >= 3 {
				uuid = watermill.NewUUID()
			}
			msgs = append(msgs, newMsg(k, c, uuid))
		}
	}
	rand.New(rand.NewPCG(uint64(seed), 0)).Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	e.note = func() string { return fmt.Sprintf("shuffle seed %d", seed) }
	e.publish(msgs...)
	e.requireExactlyOnce()
}

var errFlaky = errors.New("flaky handler failed on purpose")

// flakyHandler: 30% of all handler attempts fail before the effect; each key
// is retried until an attempt succeeds. Whether attempt a of key k fails is
// a hash of (k, a), so a run is reproducible and failures of one key are
// independent of each other. On the pg- columns (125 keys) a failure comes
// inside the effect's transaction, after its INSERT, and must roll it back.
func flakyHandler(e *env) {
	const consumers = 4
	n := e.size(500, pgScale)
	keys := keyNames("f", n)
	e.expectEffects("up", keys)
	var attempts tally[string]
	var injected atomic.Int64
	e.handle(consumers, func(msg *message.Message) error {
		e.runs.Add(1)
		key := msg.Metadata.Get("requestId")
		attempt := attempts.add(key)
		if fnvMod(fmt.Sprintf("%s/%d", key, attempt), 100) < 30 {
			injected.Add(1)
			if e.fxTable != "" {
				return e.effectInTx(msg, "up", key, nil, errFlaky)
			}
			return errFlaky
		}
		return e.effect(msg, "up", key)
	})
	e.publish(oneCopyEach(keys)...)
	e.note = func() string { return fmt.Sprintf("%d injected failures", injected.Load()) }
	e.requireExactlyOnce(func(t assert.TestingT) {
		assert.Equal(t, int(injected.Load()), e.obs.get(idempotency.OutcomeHandlerFailed), "every injected failure was seen as one")
		assert.Greater(t, injected.Load(), int64(n/10), "the run had failures to recover from")
	})
}

func fnvMod(s string, n uint32) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32() % n
}

// concurrentCopies: two copies of each key (different UUIDs, one
// requestId) published at the same moment to two consumers; the handler
// takes 200 ms, so the second copy arrives while the first runs. The keys
// go one after another, so the pg- columns run half of them.
func concurrentCopies(e *env) {
	const consumers = 2
	n := e.size(50, 2)
	keys := keyNames("c", n)
	e.expectEffects("up", keys)
	e.handle(consumers, func(msg *message.Message) error {
		e.runs.Add(1)
		if err := sleepCtx(msg.Context(), 200*time.Millisecond); err != nil {
			return err
		}
		return e.effect(msg, "up", msg.Metadata.Get("requestId"))
	})
	var wg sync.WaitGroup
	for _, k := range keys {
		a, b := newMsg(k, 0, watermill.NewUUID()), newMsg(k, 1, watermill.NewUUID())
		e.expect(a)
		e.expect(b)
		wg.Add(2)
		go func() { defer wg.Done(); e.publishOne(a) }()
		go func() { defer wg.Done(); e.publishOne(b) }()
		wg.Wait()
	}
	e.requirePublished()
	e.requireExactlyOnce(func(t assert.TestingT) {
		assert.Positive(t, e.obs.get(idempotency.OutcomeInProgress),
			"copies of a key met while its first copy ran (in_progress), at least once")
	})
}

// sleepCtx sleeps d, or returns the cause of ctx ending first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// storeOutage: the store is a private redis-server, killed (SIGKILL) for 5 s
// (and until a claim has failed) while messages stream in, then restarted. It runs with an fsync'ed
// append-only file, as a production store would: what it acknowledged
// before the crash is there after it. (Without persistence the restart
// would forget every COMPLETED key, which no dedup layer can survive.)
//
// The lease is 20 s here, longer than the outage (5 s, and at least until a
// store call has failed), as production's 40 s is longer than a store
// failover: a handler that succeeds during the outage
// keeps retrying COMPLETED within its lease and writes it once the store is
// back. With a lease shorter than the outage it gives up, acks
// (complete_failed), and any copy of the message still outstanding runs the
// handler again after the restart — the documented limit of
// OutcomeCompleteFailed, and certain on gochannel, where every consumer
// holds a copy of every message.
func storeOutage(e *env) {
	const n, consumers = 400, 2
	e.lease = 20 * time.Second
	srv := testserver.StartRedis(e.t, "--appendonly", "yes", "--appendfsync", "always")
	e.newStore = func() idempotency.Store {
		return e.redisStore(&redis.Options{ContextTimeoutEnabled: true, Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	}
	keys := keyNames("o", n)
	e.expectEffects("up", keys)
	e.handle(consumers, func(msg *message.Message) error {
		e.runs.Add(1)
		time.Sleep(5 * time.Millisecond)
		return e.effect(msg, "up", msg.Metadata.Get("requestId"))
	})
	e.publishPaced(10*time.Millisecond, oneCopyEach(keys)...)
	e.waitFor("a quarter of the keys done before the outage", func() bool { return e.tr.acks.Load() >= n/4 })
	srv.Stop()
	stopped, down := time.Now(), e.tr.acks.Load()
	// Under load a broker may deliver nothing for a while (a Kafka fetch
	// stalled behind others): the outage lasts 5 s and at least until a
	// store call has hit it, so that it is really felt. That call may be a
	// claim (the message is nacked) or the Complete of a handler that was
	// running (retried until the store is back). Waiting for a claim
	// instead could outlast the lease: when every consumer is busy retrying
	// its Complete, no claim comes until they give up.
	failedCalls := func() int {
		n := 0
		for _, c := range e.obs.failedOps() {
			n += c
		}
		return n
	}
	e.waitFor("a store call failed during the outage", func() bool { return failedCalls() > 0 })
	time.Sleep(5*time.Second - time.Since(stopped))
	srv.Start()
	outage := time.Since(stopped).Round(100 * time.Millisecond)
	e.note = func() string {
		return fmt.Sprintf("store down %v after %d acks (lease %v), failed store calls %v", outage, down, e.lease, e.obs.failedOps())
	}
	e.requireExactlyOnce(func(t assert.TestingT) {
		assert.Positive(t, failedCalls(), "the outage was felt: store calls failed")
		assert.Zero(t, e.obs.get(idempotency.OutcomeCompleteFailed), "every success was recorded COMPLETED within its lease")
	})
}

// slowHandler: each of two keys runs 5 s, 2.5 times the lease, on three
// consumers. While they run, a copy of each key (new UUID) is published
// every 500 ms, and Redis Streams also redelivers the original when its
// MaxIdleTime (3 s) runs out (NATS does not: its subscriber sends progress
// acks while the handler runs). The live handler must keep its key: one run
// per key, however many copies come.
func slowHandler(e *env) {
	const n, consumers = 2, 3
	const slow = 5 * time.Second
	keys := keyNames("s", n)
	e.expectEffects("up", keys)
	var runsPerKey tally[string]
	e.handle(consumers, func(msg *message.Message) error {
		e.runs.Add(1)
		key := msg.Metadata.Get("requestId")
		runsPerKey.add(key)
		if err := sleepCtx(msg.Context(), slow); err != nil {
			return err
		}
		return e.effect(msg, "up", key)
	})
	started := func() bool {
		for _, k := range keys {
			if runsPerKey.get(k) == 0 {
				return false
			}
		}
		return true
	}
	for _, k := range keys {
		e.publish(newMsg(k, 0, watermill.NewUUID()))
	}
	e.waitFor("both slow handlers running", started)
	copies := 0
	for !e.haveEffects("up", keys...) && e.remaining() > 0 {
		time.Sleep(500 * time.Millisecond)
		copies++
		for _, k := range keys {
			e.publish(newMsg(k, copies, watermill.NewUUID()))
		}
	}
	e.note = func() string { return fmt.Sprintf("%d copies of each key while it ran", copies) }
	originalRedelivered := func() int {
		var redelivered int
		for _, k := range keys {
			redelivered += max(0, e.tr.deliveredTimes(k+"#0")-1)
		}
		return redelivered
	}
	if e.b.timerRedelivery {
		// The broker took the original back after 3 s, while the handler
		// still ran (an acked message is never taken back); the copy it
		// redelivered may reach a consumer only once that is free again.
		e.waitFor("the broker redelivered an original, by its timer", func() bool { return originalRedelivered() > 0 })
	}
	e.requireExactlyOnce(func(t assert.TestingT) {
		for _, k := range keys {
			assert.Equal(t, 1, runsPerKey.get(k), "key %s: a live handler running 2.5× its lease is never run twice", k)
		}
		assert.Positive(t, e.obs.get(idempotency.OutcomeInProgress), "copies came while the handlers ran and were nacked")
		assert.GreaterOrEqual(t, e.obs.op("renew"), n*int(slow/(lease/3))/2, "the leases were renewed")
		if e.b.timerRedelivery {
			assert.Positive(t, originalRedelivered(), "the broker redelivered an original while its handler ran")
		}
	})
}

// outputReplay: the handler publishes one message per key to a downstream
// topic, whose consumer is deduplicated too (its key is the produced
// message's UUID). The first publish of every produced message fails: for
// half of the keys (by hash) nothing is sent, for the other half the message
// is sent and the publish still reports failure (a lost confirm), so the
// downstream gets it twice. The router nacks; the
// redelivery finds the key COMPLETED and gets the stored output, which the
// router publishes again with the same UUID. Downstream must see each
// produced message, and have its effect once. On the pg- columns (50 keys)
// the output is stored with COMPLETED in the effect's transaction.
func outputReplay(e *env) {
	const consumers = 2
	n := e.size(200, pgScale)
	keys := keyNames("r", n)
	down := e.topic + "-out"
	e.topics = append(e.topics, down)
	e.expectEffects("up", keys)
	e.expectEffects("down", keys)
	for _, k := range keys {
		e.expectID(k + "#out")
	}
	fp := &failFirstPublish{e: e, seen: map[string]string{}}
	var downRuns atomic.Int64
	e.startConsumers(consumers, func(r *message.Router, b *backends.Backend) {
		r.AddHandler(handlerName, e.topic, b.Subscriber, down, fp.wrap(b.Publisher), func(msg *message.Message) ([]*message.Message, error) {
			e.runs.Add(1)
			key := msg.Metadata.Get("requestId")
			out := message.NewMessage(watermill.NewUUID(), []byte("produced for "+key))
			out.Metadata.Set(metaID, key+"#out")
			out.Metadata.Set(metaEffect, "down/"+key)
			out.Metadata.Set(metaSource, key)
			if err := e.effectOut(msg, "up", key, []*message.Message{out}); err != nil {
				return nil, err
			}
			return []*message.Message{out}, nil
		})
		r.AddConsumerHandler(handlerName+"-downstream", down, b.Subscriber, func(msg *message.Message) error {
			e.runs.Add(1)
			downRuns.Add(1)
			return e.effect(msg, "down", msg.Metadata.Get(metaSource))
		})
	})
	e.publish(oneCopyEach(keys)...)
	e.note = func() string { return fmt.Sprintf("%d first publishes of output failed", e.publishFailed.Load()) }
	e.requireExactlyOnce(func(t assert.TestingT) {
		assert.EqualValues(t, n, e.publishFailed.Load(), "the first publish of every produced message failed")
		assert.Zero(t, fp.uuidChanged.Load(), "a replayed output kept the UUID of the first run's")
		assert.GreaterOrEqual(t, e.obs.get(idempotency.OutcomeDuplicate), n, "every key's redelivery was a duplicate that replayed the output")
	})
}

// failFirstPublish fails the first publish of every message UUID, and
// checks that every later publish for the same key carries the same UUID.
type failFirstPublish struct {
	e           *env
	mu          sync.Mutex
	seen        map[string]string // source key -> UUID of its produced message
	uuidChanged atomic.Int64
}

func (f *failFirstPublish) wrap(p message.Publisher) message.Publisher {
	return &failingPublisher{Publisher: p, f: f}
}

type failingPublisher struct {
	message.Publisher
	f *failFirstPublish
}

var errPublish = errors.New("publish failed on purpose")

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	f := p.f
	for _, m := range msgs {
		key := m.Metadata.Get(metaSource)
		f.mu.Lock()
		uuid, seen := f.seen[key]
		if !seen {
			f.seen[key] = m.UUID
		}
		f.mu.Unlock()
		if seen {
			if uuid != m.UUID {
				f.uuidChanged.Add(1)
			}
			continue
		}
		f.e.publishFailed.Add(1)
		if fnvMod(key, 2) == 1 {
			// Sent, but reported failed: the downstream gets it twice.
			if err := p.Publisher.Publish(topic, m); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: %s", errPublish, m.UUID)
	}
	return p.Publisher.Publish(topic, msgs...)
}
