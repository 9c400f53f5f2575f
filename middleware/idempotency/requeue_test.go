package idempotency_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/requeuer"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// attemptsPoisoned is the metadata the middleware puts on a message it
// refuses for MaxAttempts.
const attemptsPoisoned = "idempotency_attempts_poisoned"

// poisonRig is the recommended stack on a Redis store: PoisonQueue
// (IsPermanent) outside the middleware with MaxAttempts 2, one handler "h"
// on topic "in" that fails until fixed, and the poison topic read by the
// test.
type poisonRig struct {
	pubSub   *gochannel.GoChannel
	idem     *idempotency.Middleware
	obs      *outcomes
	store    idempotency.Store
	prefix   string
	poisoned <-chan *message.Message
	runs     atomic.Int32
	fixed    atomic.Bool
	done     chan struct{} // one value per successful run
}

const rigMaxAttempts = 2

// newPoisonRig builds the rig; inner middlewares go between the poison
// queue and the idempotency middleware.
func newPoisonRig(t *testing.T, inner ...message.HandlerMiddleware) *poisonRig {
	t.Helper()
	store, prefix := sharedRedisStore(t)
	rig := &poisonRig{store: store, prefix: prefix, done: make(chan struct{}, 10),
		pubSub: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
	t.Cleanup(func() { _ = rig.pubSub.Close() })
	var err error
	rig.poisoned, err = rig.pubSub.Subscribe(context.Background(), "poison")
	require.NoError(t, err)
	rig.idem, rig.obs = newIdem(t, testConfig{Store: store, KeyPrefix: prefix, MaxAttempts: rigMaxAttempts,
		FailedTTL: time.Minute, CompletedTTL: time.Minute})
	poison, err := wmmiddleware.PoisonQueueWithFilter(rig.pubSub, "poison", idempotency.IsPermanent)
	require.NoError(t, err)
	startRouter(t, func(r *message.Router) {
		r.AddMiddleware(poison)
		r.AddMiddleware(inner...)
		r.AddMiddleware(rig.idem.Middleware)
		r.AddConsumerHandler("h", "in", rig.pubSub, func(msg *message.Message) error {
			rig.runs.Add(1)
			if !rig.fixed.Load() {
				return errHandler
			}
			rig.done <- struct{}{}
			return nil
		})
	})
	return rig
}

// nextPoisoned returns the next message on the poison topic.
func (rig *poisonRig) nextPoisoned(t *testing.T) *message.Message {
	t.Helper()
	select {
	case m := <-rig.poisoned:
		m.Ack()
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing reached the poison topic; %d runs", rig.runs.Load())
		return nil
	}
}

// record is the stored record of msg's key.
func (rig *poisonRig) record(t *testing.T, requestID string) idempotency.Record {
	t.Helper()
	rec, err := rig.store.Get(context.Background(), rig.prefix+":h:"+requestID)
	require.NoError(t, err)
	return rec
}

// A message refused for MaxAttempts and requeued from the poison queue by
// Watermill's requeuer gets one fresh budget: with the handler still
// broken it runs MaxAttempts more times and goes back to the poison queue
// (no loop); once the handler is fixed, the next requeue runs it once; a
// copy republished after that is a duplicate.
func TestRequeuedPoisonGetsOneFreshBudget(t *testing.T) {
	rig := newPoisonRig(t)
	rq, err := requeuer.NewRequeuer(requeuer.Config{
		Subscriber:     rig.pubSub,
		SubscribeTopic: "requeue",
		Publisher:      rig.pubSub,
		GeneratePublishTopic: func(p requeuer.GeneratePublishTopicParams) (string, error) {
			return p.Message.Metadata.Get(wmmiddleware.PoisonedTopicKey), nil
		},
	}, watermill.NopLogger{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = rq.Run(ctx) }()
	// The operator requeues a poisoned message: to the requeuer's topic.
	requeue := func(m *message.Message) { require.NoError(t, rig.pubSub.Publish("requeue", m.Copy())) }

	require.NoError(t, rig.pubSub.Publish("in", newMsg("pill", "p")))
	first := rig.nextPoisoned(t)
	assert.EqualValues(t, rigMaxAttempts, rig.runs.Load(), "MaxAttempts runs before the poison queue")
	assert.Equal(t, strconv.Itoa(rigMaxAttempts+1), first.Metadata.Get(attemptsPoisoned), "the count at the refusal")
	assert.Equal(t, "h", first.Metadata.Get(wmmiddleware.PoisonedHandlerKey))

	// Requeued with the handler still broken: one budget more, then back.
	requeue(first)
	second := rig.nextPoisoned(t)
	assert.EqualValues(t, 2*rigMaxAttempts, rig.runs.Load(), "a requeue is one fresh budget, not more")
	assert.Equal(t, "1", second.Metadata.Get(requeuer.RetriesKey), "it came through Watermill's requeuer")
	assert.Equal(t, strconv.Itoa(2*rigMaxAttempts+2), second.Metadata.Get(attemptsPoisoned), "the new count goes out with it")
	assert.Equal(t, 2, rig.obs.get(idempotency.OutcomeTooManyAttempts))

	// Fixed, and requeued again: it runs once.
	rig.fixed.Store(true)
	requeue(second)
	select {
	case <-rig.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the requeued message did not run; %d runs", rig.runs.Load())
	}
	require.Eventually(t, func() bool { return rig.obs.get(idempotency.OutcomeProcessed) == 1 }, 10*time.Second, 5*time.Millisecond)
	rec := rig.record(t, "pill")
	assert.Equal(t, idempotency.StateCompleted, rec.State)
	assert.Equal(t, 2*rigMaxAttempts+3, rec.Attempts)

	// Every older copy, requeued or republished by hand, is a duplicate.
	for _, m := range []*message.Message{first, second} {
		require.NoError(t, rig.pubSub.Publish("in", m.Copy()))
	}
	require.Eventually(t, func() bool { return rig.obs.get(idempotency.OutcomeDuplicate) == 2 }, 10*time.Second, 5*time.Millisecond)
	assert.EqualValues(t, 2*rigMaxAttempts+1, rig.runs.Load(), "a completed key never runs again")
}

// The ways a copy could get a budget it has no right to: a count above
// the record's (made up, or from an expired record), a count with no
// poison queue's mark or another handler's, and a second copy of one
// requeue. None runs the handler past the budget.
func TestRequeuedPoisonBudgetCannotBeStretched(t *testing.T) {
	rig := newPoisonRig(t)
	require.NoError(t, rig.pubSub.Publish("in", newMsg("pill", "p")))
	poisoned := rig.nextPoisoned(t)
	require.EqualValues(t, rigMaxAttempts, rig.runs.Load())

	forged := func(set map[string]string, drop ...string) *message.Message {
		m := poisoned.Copy()
		m.UUID = watermill.NewUUID()
		for k, v := range set {
			m.Metadata.Set(k, v)
		}
		for _, k := range drop {
			delete(m.Metadata, k)
		}
		return m
	}
	for name, m := range map[string]*message.Message{
		"count above the record's": forged(map[string]string{attemptsPoisoned: "1000"}),
		"another handler's":        forged(map[string]string{wmmiddleware.PoisonedHandlerKey: "other"}),
		"no poison queue's mark":   forged(nil, wmmiddleware.PoisonedHandlerKey),
		"a count that is no count": forged(map[string]string{attemptsPoisoned: "-3"}),
	} {
		require.NoError(t, rig.pubSub.Publish("in", m))
		back := rig.nextPoisoned(t)
		assert.EqualValues(t, rigMaxAttempts, rig.runs.Load(), "%s: refused without running", name)
		n, err := strconv.Atoi(back.Metadata.Get(attemptsPoisoned))
		require.NoError(t, err)
		assert.Greater(t, n, rigMaxAttempts, "%s: the count it goes back with", name)
	}

	// Two copies of one requeue share its budget: MaxAttempts runs in all.
	rec := rig.record(t, "pill")
	twin := poisoned.Copy()
	twin.Metadata.Set(attemptsPoisoned, strconv.Itoa(rec.Attempts))
	twin2 := twin.Copy()
	twin2.UUID = watermill.NewUUID()
	require.NoError(t, rig.pubSub.Publish("in", twin, twin2))
	rig.nextPoisoned(t)
	rig.nextPoisoned(t)
	assert.EqualValues(t, 2*rigMaxAttempts, rig.runs.Load(), "two copies of one requeue: one budget")
}

// Watermill's Retry between the poison queue and the middleware hands the
// refused message back to it: that retry is no requeue, and gets no
// budget, also for a copy that was requeued once already.
func TestRequeuedPoisonUnderRetryGetsOneBudget(t *testing.T) {
	const retries = 3
	rig := newPoisonRig(t, wmmiddleware.Retry{MaxRetries: retries, InitialInterval: time.Millisecond}.Middleware)
	require.NoError(t, rig.pubSub.Publish("in", newMsg("pill", "p")))
	first := rig.nextPoisoned(t)
	assert.EqualValues(t, rigMaxAttempts, rig.runs.Load(), "MaxAttempts runs, then the retries are refused")
	assert.Equal(t, strconv.Itoa(1+retries), first.Metadata.Get(attemptsPoisoned))

	require.NoError(t, rig.pubSub.Publish("in", first.Copy()))
	second := rig.nextPoisoned(t)
	assert.EqualValues(t, 2*rigMaxAttempts, rig.runs.Load(), "the requeue is one budget, whatever Retry does with it")
	assert.Equal(t, strconv.Itoa(2*(1+retries)), second.Metadata.Get(attemptsPoisoned))
	assert.Equal(t, "h", second.Metadata.Get(wmmiddleware.PoisonedHandlerKey), "the poison queue marked it again")
}
