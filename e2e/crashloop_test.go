package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// The crash-loop child's variables, beside those every child has.
const (
	loopPoisonTopicVar = "E2E_POISON_TOPIC"
	loopPoisonKeyVar   = "E2E_POISON_KEY"
)

// crashLoopMaxAttempts is the consumers' MaxAttempts in the crash-loop
// scenario: the poison message kills this many consumers, then goes to the
// poison topic.
const crashLoopMaxAttempts = 3

// Ledger hashes of the crash-loop scenario, beside "up" (the effects).
const (
	// loopRunsHash counts, per key, the handler runs that killed the child.
	loopRunsHash = "poison-runs"
	// loopOutcomesHash counts the child's middleware outcomes.
	loopOutcomesHash = "outcomes"
)

// crashLoopChild is a consumer whose handler records the effect of every key
// in the ledger, except for one poison key: its handler counts the run in
// the ledger and exits the process, as an OOM kill or a segfault in cgo
// would, before it can complete or fail the key. The middleware stack is the
// recommended one: PoisonQueue (filtered by IsPermanent) outside the
// idempotency middleware with MaxAttempts. It stops cleanly on SIGTERM.
func crashLoopChild(k *childKit) error {
	idem, err := k.idempotency(crashLoopMaxAttempts, ledgerObserver{ledger: k.ledger, hash: k.ledgerKey(loopOutcomesHash)})
	if err != nil {
		return err
	}
	poison, err := wmmiddleware.PoisonQueueWithFilter(k.b.Publisher, os.Getenv(loopPoisonTopicVar), idempotency.IsPermanent)
	if err != nil {
		return err
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger())
	if err != nil {
		return err
	}
	g := newExitGate()
	r.AddMiddleware(poison, g.middleware, idem.Middleware)
	poisonKey := os.Getenv(loopPoisonKeyVar)
	r.AddConsumerHandler(handlerName, k.topic, k.b.Subscriber, func(msg *message.Message) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		key := msg.Metadata.Get("requestId")
		if key == poisonKey {
			if err := k.ledger.HIncrBy(ctx, k.ledgerKey(loopRunsHash), key, 1).Err(); err != nil {
				fmt.Fprintln(os.Stderr, "crash-loop child: ledger:", err)
				os.Exit(2)
			}
			g.exit(1)
		}
		if err := k.ledger.HIncrBy(ctx, k.ledgerKey("up"), key, 1).Err(); err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		return nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return r.Run(ctx)
}

// exitGate lets the poison handler exit the process only between the other
// deliveries: it stops new ones from entering the idempotency middleware and
// waits for those inside to return. A death in the middle of another key's
// handler, after its effect and before COMPLETED, would run that effect
// again on redelivery: the at-least-once window of every crash, which the
// crash scenario covers. Here each death must be the poison's alone, so that
// "every other key exactly once" tests the crash loop and nothing else.
type exitGate struct {
	mu       sync.Mutex
	idle     *sync.Cond
	exiting  bool
	inflight int
}

func newExitGate() *exitGate {
	g := &exitGate{}
	g.idle = sync.NewCond(&g.mu)
	return g
}

func (g *exitGate) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		g.mu.Lock()
		if g.exiting {
			g.mu.Unlock()
			select {} // the process is about to exit; the broker redelivers this one
		}
		g.inflight++
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.inflight--
			g.idle.Broadcast()
			g.mu.Unlock()
		}()
		return h(msg)
	}
}

// exit waits until the caller's delivery is the only one inside the gate,
// then exits the process with code.
func (g *exitGate) exit(code int) {
	g.mu.Lock()
	g.exiting = true
	for g.inflight > 1 {
		g.idle.Wait()
	}
	os.Exit(code)
}

// ledgerObserver counts the child's outcomes in a ledger hash, so that the
// test, in another process, can check them.
type ledgerObserver struct {
	ledger *redis.Client
	hash   string
}

func (o ledgerObserver) CacheLookup(string, bool) {}

func (o ledgerObserver) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	outcome := d.Outcome
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.ledger.HIncrBy(ctx, o.hash, string(outcome), 1).Err(); err != nil {
		fmt.Fprintln(os.Stderr, "crash-loop child: ledger:", err)
	}
}

func (ledgerObserver) StoreLatency(string, time.Duration, error) {}

// crashLoop: a poison message kills its consumer every time its handler
// runs (os.Exit inside the handler, before the key is completed or failed).
// The consumer, a child process, is restarted each time it dies, as
// Kubernetes restarts a crashing container, under the same consumer name.
// The stack is the recommended one: PoisonQueue with IsPermanent outside the
// idempotency middleware, MaxAttempts 3. Each death leaves the key
// IN_PROGRESS until its 2 s lease lapses; the next claim counts one more
// attempt, because the record, and its count, outlive the lease. So the
// poison runs exactly 3 times, and its fourth delivery is refused with
// ErrTooManyAttempts and published once to the poison topic. Meanwhile the
// other keys, published with it and after the first death, are each
// processed exactly once.
//
// The brokers bring the message back by their own means: Kafka after the
// group rebalances, Redis Streams by XCLAIM after MaxIdleTime, RabbitMQ at
// once (the connection dropped; the copy is nacked as in progress until the
// lease lapses), NATS after AckWait.
func crashLoop(e *env) {
	const n = 40
	keys := keyNames("l", n)
	poisonKey := "l-poison"
	e.expectEffects("up", keys)
	poisoned := e.readPoisonTopic()
	cfg := e.b.config(e.url, e.group, e.id+"-looper")
	cfg.AMQP.PublishGroups = []string{poisoned.group}
	e.publish(oneCopyEach(append([]string{poisonKey}, keys[:n/2]...))...)

	// The child dies of the poison and is started again, until the other
	// keys are done and the poison is on its topic; then it gets SIGTERM.
	loop := &loopRun{e: e, n: n, poisonKey: poisonKey, poisoned: poisoned}
	for i := 0; ; i++ {
		c := e.startChild("crash-loop", cfg, loopPoisonTopicVar+"="+poisoned.topic, loopPoisonKeyVar+"="+poisonKey)
		err := e.awaitExit(c, loop.done, loop.String)
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
			if err != nil {
				e.t.Fatalf("crash-loop child %d: %v: %s", i, err, c.output())
			}
			break // stopped by SIGTERM once done
		}
		loop.died()
		if loop.deaths == 1 {
			// The other messages keep coming while the poison loops.
			e.publish(oneCopyEach(keys[n/2:])...)
		}
	}
	e.requirePoisonedOnce(loop)
}

// loopRun is the progress of the crash loop, read from the ledger that the
// children write and from the poison topic.
type loopRun struct {
	e              *env
	n              int
	poisonKey      string
	poisoned       *poisonLog
	deaths         int
	effectsAtDeath []string // how far the other keys had got at each death
}

func (l *loopRun) ledgerInt(hash, field string) int {
	v, err := l.e.ledger.HGet(context.Background(), l.e.ledgerKey(hash), field).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		l.e.t.Fatalf("ledger: %v", err)
	}
	return v
}

func (l *loopRun) effectCount() int64 {
	n, err := l.e.ledger.HLen(context.Background(), l.e.ledgerKey("up")).Result()
	require.NoError(l.e.t, err)
	return n
}

// done: every other key had its effect, and the poison reached its topic.
func (l *loopRun) done() bool {
	return len(l.poisoned.all()) > 0 && l.effectCount() >= int64(l.n)
}

func (l *loopRun) String() string {
	return fmt.Sprintf("%d deaths, poison ran %d times, %d messages on the poison topic, %d of %d effects",
		l.deaths, l.ledgerInt(loopRunsHash, l.poisonKey), len(l.poisoned.all()), l.effectCount(), l.n)
}

// died counts a death of the child, which must not outnumber MaxAttempts.
func (l *loopRun) died() {
	l.deaths++
	l.effectsAtDeath = append(l.effectsAtDeath, strconv.FormatInt(l.effectCount(), 10))
	if runs := l.ledgerInt(loopRunsHash, l.poisonKey); l.deaths > crashLoopMaxAttempts || runs > crashLoopMaxAttempts {
		l.e.t.Fatalf("%s: the poison message killed its consumer %d times and ran %d times, with MaxAttempts %d: "+
			"its attempts did not survive the lapsed leases", l.e.id, l.deaths, runs, crashLoopMaxAttempts)
	}
}

// requirePoisonedOnce is the crash loop's accounting, from what the
// children wrote to the ledger, the poison topic and the store: the poison
// ran MaxAttempts times and reached the poison topic once, its key is left
// FAILED with its attempts counted, and every other key had its effect
// exactly once. If any check fails, it ends the test with every count.
func (e *env) requirePoisonedOnce(l *loopRun) {
	e.t.Helper()
	ctx := context.Background()
	elapsed := time.Since(e.start)
	ledger, effects := e.countEffects()
	runs := l.ledgerInt(loopRunsHash, l.poisonKey)
	outcomes, err := e.ledger.HGetAll(ctx, e.ledgerKey(loopOutcomesHash)).Result()
	require.NoError(e.t, err)
	outcome := func(o idempotency.Outcome) int { n, _ := strconv.Atoi(outcomes[string(o)]); return n }
	counts := fmt.Sprintf("deaths %d  poison runs %d  effects %5d  duplicates %5d  in_progress %4d  elapsed %5.1fs  "+
		"(published %d, poisoned %d, other keys done at each death %s)",
		l.deaths, runs, effects, outcome(idempotency.OutcomeDuplicate), outcome(idempotency.OutcomeInProgress),
		elapsed.Seconds(), e.published, len(l.poisoned.all()), strings.Join(l.effectsAtDeath, "/"))
	e.report(counts)
	// The poison topic is read until the child stopped; its publish came
	// before the ack of the refused delivery, so a second one would have
	// been read by now as surely as the first.
	time.Sleep(500 * time.Millisecond)
	got := l.poisoned.all()
	// The store kept the count across the lapsed leases: three runs and the
	// claim that MaxAttempts refused.
	rec, recErr := e.newStore().Get(ctx, e.prefix+":"+handlerName+":"+l.poisonKey)

	e.requireAll(fmt.Sprintf("%s; outcomes %v; %v", counts, outcomes, ledger), checkEffects(ledger), func(t assert.TestingT) {
		assert.Equal(t, crashLoopMaxAttempts, l.deaths, "the poison message killed MaxAttempts consumers")
		assert.Equal(t, crashLoopMaxAttempts, runs, "the poison's handler ran MaxAttempts times")
		if assert.Len(t, got, 1, "the poison message reached the poison topic once") {
			assert.Equal(t, l.poisonKey, got[0].Metadata.Get("requestId"))
			assert.Contains(t, got[0].Metadata.Get(wmmiddleware.ReasonForPoisonedKey), idempotency.ErrTooManyAttempts.Error())
			assert.Equal(t, e.topic, got[0].Metadata.Get(wmmiddleware.PoisonedTopicKey))
		}
		assert.Equal(t, l.n, outcome(idempotency.OutcomeProcessed), "one successful run per other key")
		assert.Equal(t, 1, outcome(idempotency.OutcomeTooManyAttempts), "one delivery of the poison was refused")
		for _, bad := range []idempotency.Outcome{idempotency.OutcomeHandlerFailed, idempotency.OutcomeLeaseLost,
			idempotency.OutcomeCompleteFailed, idempotency.OutcomeMissingKey, idempotency.OutcomeKeyReused,
			idempotency.OutcomeStoreUnavailable, idempotency.OutcomeFailOpen} {
			assert.Zero(t, outcome(bad), "outcome %s", bad)
		}
		if assert.NoError(t, recErr, "the poison's record") {
			assert.Equal(t, idempotency.StateFailed, rec.State, "the poison's key is left FAILED")
			assert.Equal(t, crashLoopMaxAttempts+1, rec.Attempts, "the poison's attempts: its runs and the refused claim")
		}
	})
}

// readPoisonTopic reads the scenario's poison topic, in a group of its own
// (on gochannel, from the shared instance), until the end of the test.
func (e *env) readPoisonTopic() *poisonLog {
	p := &poisonLog{topic: e.topic + "-poison", group: e.group + "-poison"}
	e.topics = append(e.topics, p.topic)
	e.t.Cleanup(func() {
		if e.b.cleanup != nil {
			e.b.cleanup(e.t, e.url, []string{p.topic}, p.group)
		}
	})
	reader := e.shared
	if reader == nil {
		var err error
		reader, err = backends.New(e.b.config(e.url, p.group, e.id+"-poison-reader"), logger())
		require.NoError(e.t, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var reading sync.WaitGroup
	e.t.Cleanup(func() {
		stop()
		if reader != e.shared {
			_ = reader.Close()
		}
		reading.Wait()
	})
	msgs, err := reader.Subscriber.Subscribe(ctx, p.topic)
	require.NoError(e.t, err)
	reading.Add(1)
	go func() {
		defer reading.Done()
		for m := range msgs {
			p.add(m)
			m.Ack()
		}
	}()
	return p
}

// poisonLog keeps what arrived on the poison topic.
type poisonLog struct {
	topic, group string

	mu   sync.Mutex
	msgs []*message.Message
}

func (p *poisonLog) add(m *message.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, m)
}

func (p *poisonLog) all() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}
