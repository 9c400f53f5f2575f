package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/requeuer"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// requeueMaxAttempts is the consumer's MaxAttempts in the requeue
// scenario.
const requeueMaxAttempts = 3

var errBroken = errors.New("handler broken until it is fixed")

// requeuePoison: one key's handler fails on every run until it is fixed.
// With the recommended stack (PoisonQueue filtered by IsPermanent outside
// the middleware, MaxAttempts 3), it runs 3 times and its fourth delivery
// goes to the poison topic, while 20 other keys are each processed once.
// Then the handler is fixed, and Watermill's requeuer, started in a group
// of its own on the poison topic, publishes the message back to the topic
// it came from (PoisonedTopicKey). No key is released by hand: the
// requeued copy gets a fresh budget from the count it was poisoned with,
// and runs once. A copy of the poisoned message republished by hand after
// that is acked as a duplicate: the completed key never runs again.
func requeuePoison(e *env) {
	const n = 20
	keys := keyNames("q", n)
	poisonKey := "q-poison"
	e.expectEffects("up", append([]string{poisonKey}, keys...))
	poisoned := e.readPoisonTopic()
	requeueGroup := e.group + "-requeue"
	e.t.Cleanup(func() {
		if e.b.cleanup != nil {
			e.b.cleanup(e.t, e.url, []string{poisoned.topic}, requeueGroup)
		}
	})
	// On RabbitMQ the poison topic's queues must exist before its first
	// message: the consumer declares them at every publish.
	e.configure = func(cfg *backends.Config) { setParam(cfg, "amqp", "publish_groups", poisoned.group+","+requeueGroup) }
	e.maxAttempts, e.poisonTopic = requeueMaxAttempts, poisoned.topic

	var fixed atomic.Bool
	var poisonRuns, runsWhenPoisoned atomic.Int64
	var requeuedRetries atomic.Value // the requeuer's count on the run that succeeded
	e.handle(1, func(msg *message.Message) error {
		e.runs.Add(1)
		key := msg.Metadata.Get("requestId")
		if key == poisonKey {
			poisonRuns.Add(1)
			if !fixed.Load() {
				return errBroken
			}
			requeuedRetries.Store(msg.Metadata.Get(requeuer.RetriesKey))
		}
		return e.effect(msg, "up", key)
	})
	e.publish(oneCopyEach(append([]string{poisonKey}, keys...))...)
	e.waitFor("the poison on its topic and the other keys done", func() bool {
		return len(poisoned.all()) > 0 && e.haveEffects("up", keys...)
	})
	runsWhenPoisoned.Store(poisonRuns.Load())

	fixed.Store(true)
	e.runRequeuer(poisoned.topic, requeueGroup)
	e.waitFor("the requeued message processed", func() bool { return e.haveEffects("up", poisonKey) })

	// An operator republishes the poisoned message by hand as well.
	again := poisoned.all()[0].Copy()
	e.publish(again)
	e.waitFor("the copy republished by hand acked as a duplicate", func() bool {
		return e.obs.get(idempotency.OutcomeDuplicate) > 0
	})

	a := e.settle()
	o := a.outcomes
	first := poisoned.all()[0]
	rec, recErr := e.newStore().Get(context.Background(), e.prefix+":"+handlerName+":"+poisonKey)
	counts := fmt.Sprintf("deliveries %6d  runs %5d  effects %5d  duplicates %5d  nacks %5d  elapsed %5.1fs  "+
		"(published %d, poison ran %d times before the requeue and %d in all, poisoned %d)",
		a.deliveries, a.runs, a.effects, o[idempotency.OutcomeDuplicate], a.nacks, a.elapsed.Seconds(),
		a.published, runsWhenPoisoned.Load(), poisonRuns.Load(), len(poisoned.all()))
	e.report(counts)
	e.requireAll(fmt.Sprintf("%s; %s; record %+v (%v)", counts, a.String(), rec, recErr), checkEffects(a.ledger), func(t assert.TestingT) {
		assert.EqualValues(t, requeueMaxAttempts, runsWhenPoisoned.Load(), "MaxAttempts runs before the poison topic")
		assert.EqualValues(t, requeueMaxAttempts+1, poisonRuns.Load(), "one run after the requeue, and none for the copy by hand")
		assert.Equal(t, "1", requeuedRetries.Load(), "the run that succeeded had come through Watermill's requeuer once")
		assert.Len(t, poisoned.all(), 1, "the poison topic got the message once")
		assert.Contains(t, first.Metadata.Get(wmmiddleware.ReasonForPoisonedKey), idempotency.ErrTooManyAttempts.Error())
		assert.Equal(t, e.topic, first.Metadata.Get(wmmiddleware.PoisonedTopicKey))
		assert.Equal(t, handlerName, first.Metadata.Get(wmmiddleware.PoisonedHandlerKey))
		assert.Equal(t, strconv.Itoa(requeueMaxAttempts+1), first.Metadata.Get("idempotency_attempts_poisoned"),
			"the key's attempts when it was refused")

		assert.Equal(t, n+1, o[idempotency.OutcomeProcessed], "one successful run per key")
		assert.Equal(t, requeueMaxAttempts, o[idempotency.OutcomeHandlerFailed])
		assert.Equal(t, 1, o[idempotency.OutcomeTooManyAttempts], "one delivery refused, none after the requeue")
		assert.Positive(t, o[idempotency.OutcomeDuplicate])
		for _, bad := range []idempotency.Outcome{idempotency.OutcomeLeaseLost, idempotency.OutcomeCompleteFailed,
			idempotency.OutcomeMissingKey, idempotency.OutcomeKeyReused, idempotency.OutcomeStoreUnavailable,
			idempotency.OutcomeFailOpen} {
			assert.Zero(t, o[bad], "outcome %s", bad)
		}
		assert.EqualValues(t, o[idempotency.OutcomeProcessed]+o[idempotency.OutcomeDuplicate]+o[idempotency.OutcomeTooManyAttempts],
			a.acks, "acks: the successful runs, the duplicates and the delivery moved to the poison topic")
		assert.GreaterOrEqual(t, int(a.nacks), o[idempotency.OutcomeHandlerFailed], "every failed run was nacked")
		assert.EqualValues(t, 1, a.ackedEarly, "acked before its effect: only the delivery moved to the poison topic, %v", a.early)
		if assert.NoError(t, recErr, "the poison's record") {
			assert.Equal(t, idempotency.StateCompleted, rec.State)
			assert.Equal(t, requeueMaxAttempts+2, rec.Attempts, "its runs, the refused claim and the run after the requeue")
		}
	})
}

// runRequeuer runs Watermill's requeuer until the end of the test: it
// reads topic in a group of its own (on gochannel, from the shared
// instance) and publishes each message back to the topic it was poisoned
// on.
func (e *env) runRequeuer(topic, group string) {
	e.t.Helper()
	b := e.shared
	if b == nil {
		cfg := e.b.config(e.url, group, e.id+"-requeuer")
		setParam(&cfg, "amqp", "publish_groups", e.group)
		var err error
		b, err = backends.New(cfg, logger())
		require.NoError(e.t, err)
		e.t.Cleanup(func() { _ = b.Close() })
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger())
	require.NoError(e.t, err)
	rq, err := requeuer.NewRequeuer(requeuer.Config{
		Subscriber:     b.Subscriber,
		SubscribeTopic: topic,
		Publisher:      b.Publisher,
		GeneratePublishTopic: func(p requeuer.GeneratePublishTopicParams) (string, error) {
			return p.Message.Metadata.Get(wmmiddleware.PoisonedTopicKey), nil
		},
		Router: r,
	}, logger())
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rq.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); _ = r.Close(); <-done })
	select {
	case <-r.Running():
	case <-time.After(30 * time.Second):
		e.t.Fatalf("the requeuer of %s did not start", e.id)
	}
}
