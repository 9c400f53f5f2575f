package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// The crash-loop child is this test binary, re-executed with these variables
// set beside the BROKER_* ones and those of the crash child (store, ledger,
// key prefix); TestMain runs crashLoopChild instead of the tests.
const (
	loopChildVar        = "E2E_CRASH_LOOP_CHILD" // the topic to consume
	loopPoisonTopicVar  = "E2E_POISON_TOPIC"
	loopPoisonKeyVar    = "E2E_POISON_KEY"
	loopLedgerPrefixVar = "E2E_LEDGER_PREFIX"
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
func crashLoopChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash-loop child:", err)
		return 2
	}
	cfg, err := backends.FromEnv()
	if err != nil {
		return fail(err)
	}
	cfg.Kafka.Tune = kafkaTune
	b, err := backends.New(cfg, logger())
	if err != nil {
		return fail(err)
	}
	store, err := childStore()
	if err != nil {
		return fail(err)
	}
	ledger := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: os.Getenv(childLedgerVar)})
	ledgerKey := func(hash string) string { return os.Getenv(loopLedgerPrefixVar) + ":" + hash }
	idem, err := idempotency.New(idempotency.Config{
		Store: store, KeyPrefix: os.Getenv(childPrefixVar), LeaseTTL: lease, NackDelay: nackDelay,
		StoreTimeout: time.Second, CompletedTTL: time.Hour, FailedTTL: time.Hour,
		MaxAttempts: crashLoopMaxAttempts,
		Observer:    ledgerObserver{ledger: ledger, hash: ledgerKey(loopOutcomesHash)},
	}, logger())
	if err != nil {
		return fail(err)
	}
	poison, err := wmmiddleware.PoisonQueueWithFilter(b.Publisher, os.Getenv(loopPoisonTopicVar), idempotency.IsPermanent)
	if err != nil {
		return fail(err)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, logger())
	if err != nil {
		return fail(err)
	}
	g := newExitGate()
	r.AddMiddleware(poison, g.middleware, idem.Middleware)
	poisonKey := os.Getenv(loopPoisonKeyVar)
	r.AddConsumerHandler(handlerName, os.Getenv(loopChildVar), b.Subscriber, func(msg *message.Message) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		key := msg.Metadata.Get("requestId")
		if key == poisonKey {
			if err := ledger.HIncrBy(ctx, ledgerKey(loopRunsHash), key, 1).Err(); err != nil {
				fmt.Fprintln(os.Stderr, "crash-loop child: ledger:", err)
				os.Exit(2)
			}
			g.exit(1)
		}
		if err := ledger.HIncrBy(ctx, ledgerKey("up"), key, 1).Err(); err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		return nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := r.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
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

func (o ledgerObserver) Outcome(_ string, outcome idempotency.Outcome) {
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
	poisonTopic := e.topic + "-poison"
	poisonGroup := e.group + "-poison"
	e.topics = append(e.topics, poisonTopic)
	e.t.Cleanup(func() {
		if e.b.cleanup != nil {
			e.b.cleanup(e.t, e.url, []string{poisonTopic}, poisonGroup)
		}
	})

	// The poison topic's reader, in its own group.
	reader, err := backends.New(e.b.config(e.url, poisonGroup, e.id+"-poison-reader"), logger())
	require.NoError(e.t, err)
	readCtx, stopReading := context.WithCancel(context.Background())
	poisoned := &poisonLog{}
	var readerDone sync.WaitGroup
	e.t.Cleanup(func() {
		stopReading()
		_ = reader.Close()
		readerDone.Wait()
	})
	poisonMsgs, err := reader.Subscriber.Subscribe(readCtx, poisonTopic)
	require.NoError(e.t, err)
	readerDone.Add(1)
	go func() {
		defer readerDone.Done()
		for m := range poisonMsgs {
			poisoned.add(m)
			m.Ack()
		}
	}()

	self, err := os.Executable()
	require.NoError(e.t, err)
	cfg := e.b.config(e.url, e.group, e.id+"-looper")
	cfg.AMQP.PublishGroups = []string{poisonGroup}
	childEnvs := append(os.Environ(), childEnv(cfg)...)
	childEnvs = append(childEnvs,
		loopChildVar+"="+e.topic,
		loopPoisonTopicVar+"="+poisonTopic,
		loopPoisonKeyVar+"="+poisonKey,
		loopLedgerPrefixVar+"="+e.id,
		childLedgerVar+"="+e.ledger.Options().Addr,
		childPrefixVar+"="+e.prefix,
	)
	childEnvs = append(childEnvs, e.childStoreEnv()...)
	logDir := e.t.TempDir()
	start := func(i int) (*exec.Cmd, <-chan error, string) {
		logPath := filepath.Join(logDir, "child-"+strconv.Itoa(i)+".log")
		logFile, err := os.Create(logPath)
		require.NoError(e.t, err)
		child := exec.Command(self, "-test.run=^$")
		child.Env = childEnvs
		child.Stdout, child.Stderr = logFile, logFile
		require.NoError(e.t, child.Start())
		exited := make(chan error, 1)
		go func() { exited <- child.Wait(); _ = logFile.Close() }()
		return child, exited, logPath
	}

	first := []*message.Message{newMsg(poisonKey, 0, watermill.NewUUID())}
	for _, k := range keys[:n/2] {
		first = append(first, newMsg(k, 0, watermill.NewUUID()))
	}
	e.publish(first...)

	ctx := context.Background()
	ledgerInt := func(hash, field string) int {
		v, err := e.ledger.HGet(ctx, e.ledgerKey(hash), field).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			e.t.Fatalf("ledger: %v", err)
		}
		return v
	}
	effectCount := func() int64 {
		n, err := e.ledger.HLen(ctx, e.ledgerKey("up")).Result()
		require.NoError(e.t, err)
		return n
	}
	deaths := 0
	var effectsAtDeath []string // how far the other keys had got at each death
	for i := 0; ; i++ {
		child, exited, logPath := start(i)
		err, stopped := error(nil), false
		func() {
			// A failure below must not leave the child running.
			defer func() {
				if !stopped {
					_ = child.Process.Kill()
					<-exited
				}
			}()
			for !stopped {
				select {
				case err = <-exited:
					stopped = true
				case <-time.After(50 * time.Millisecond):
					if e.remaining() <= 0 {
						e.t.Fatalf("%s: not done within the %v budget: %d deaths, poison ran %d times, %d messages on the poison topic, %d of %d effects",
							e.id, e.budget, deaths, ledgerInt(loopRunsHash, poisonKey), poisoned.count(), effectCount(), n)
					}
					if poisoned.count() > 0 && effectCount() >= n {
						require.NoError(e.t, child.Process.Signal(syscall.SIGTERM))
						err, stopped = <-exited, true
					}
				}
			}
		}()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) && exitErr.ExitCode() == 1 {
			deaths++
			effectsAtDeath = append(effectsAtDeath, strconv.FormatInt(effectCount(), 10))
			if runs := ledgerInt(loopRunsHash, poisonKey); deaths > crashLoopMaxAttempts || runs > crashLoopMaxAttempts {
				e.t.Fatalf("%s: the poison message killed its consumer %d times and ran %d times, with MaxAttempts %d: "+
					"its attempts did not survive the lapsed leases", e.id, deaths, runs, crashLoopMaxAttempts)
			}
			if deaths == 1 {
				// The other messages keep coming while the poison loops.
				var more []*message.Message
				for _, k := range keys[n/2:] {
					more = append(more, newMsg(k, 0, watermill.NewUUID()))
				}
				e.publish(more...)
			}
			continue
		}
		if err != nil {
			log, _ := os.ReadFile(logPath)
			e.t.Fatalf("crash-loop child %d: %v: %s", i, err, log)
		}
		break // stopped by SIGTERM once done
	}
	elapsed := time.Since(e.start)

	effects := e.checkLedger()
	runs := ledgerInt(loopRunsHash, poisonKey)
	outcomes, err := e.ledger.HGetAll(ctx, e.ledgerKey(loopOutcomesHash)).Result()
	require.NoError(e.t, err)
	outcome := func(o idempotency.Outcome) int { n, _ := strconv.Atoi(outcomes[string(o)]); return n }
	line := fmt.Sprintf("%-9s %-17s deaths %d  poison runs %d  effects %5d  duplicates %5d  in_progress %4d  elapsed %5.1fs  "+
		"(published %d, poisoned %d, other keys done at each death %s)",
		e.b.name, e.name, deaths, runs, effects, outcome(idempotency.OutcomeDuplicate), outcome(idempotency.OutcomeInProgress),
		elapsed.Seconds(), e.published, poisoned.count(), strings.Join(effectsAtDeath, "/"))
	e.t.Log(line)
	summary.add(e.b.name, e.name, line)

	assert.Equal(e.t, crashLoopMaxAttempts, deaths, "the poison message killed MaxAttempts consumers")
	assert.Equal(e.t, crashLoopMaxAttempts, runs, "the poison's handler ran MaxAttempts times")
	// The poison topic is read until the child stopped; its publish came
	// before the ack of the refused delivery, so a second one would have
	// been read by now as surely as the first.
	time.Sleep(500 * time.Millisecond)
	got := poisoned.all()
	if assert.Len(e.t, got, 1, "the poison message reached the poison topic once") {
		assert.Equal(e.t, poisonKey, got[0].Metadata.Get("requestId"))
		assert.Contains(e.t, got[0].Metadata.Get(wmmiddleware.ReasonForPoisonedKey), idempotency.ErrTooManyAttempts.Error())
		assert.Equal(e.t, e.topic, got[0].Metadata.Get(wmmiddleware.PoisonedTopicKey))
	}
	assert.Equal(e.t, n, outcome(idempotency.OutcomeProcessed), "one successful run per other key")
	assert.Equal(e.t, 1, outcome(idempotency.OutcomeTooManyAttempts), "one delivery of the poison was refused")
	for _, bad := range []idempotency.Outcome{idempotency.OutcomeHandlerFailed, idempotency.OutcomeLeaseLost,
		idempotency.OutcomeCompleteFailed, idempotency.OutcomeMissingKey, idempotency.OutcomeKeyReused,
		idempotency.OutcomeStoreUnavailable, idempotency.OutcomeFailOpen} {
		assert.Zero(e.t, outcome(bad), "outcome %s", bad)
	}

	// The store kept the count across the lapsed leases: three runs and the
	// claim that MaxAttempts refused.
	rec, err := e.newStore().Get(ctx, e.prefix+":"+handlerName+":"+poisonKey)
	require.NoError(e.t, err)
	assert.Equal(e.t, idempotency.StateFailed, rec.State, "the poison's key is left FAILED")
	assert.Equal(e.t, crashLoopMaxAttempts+1, rec.Attempts, "the poison's attempts: its runs and the refused claim")
}

// poisonLog keeps what arrived on the poison topic.
type poisonLog struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (p *poisonLog) add(m *message.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, m)
}

func (p *poisonLog) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.msgs)
}

func (p *poisonLog) all() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}
