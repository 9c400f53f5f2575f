package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crashChild is a consumer that claims keys and then hangs in its handler
// until it is killed. Before hanging, it writes each key and the time its
// handler started (after the claim) to the ledger hash "started".
func crashChild(k *childKit) error {
	idem, err := k.idempotency(0, nil)
	if err != nil {
		return err
	}
	r, err := message.NewRouter(message.RouterConfig{}, logger())
	if err != nil {
		return err
	}
	r.AddMiddleware(idem.Middleware)
	r.AddConsumerHandler(handlerName, k.topic, k.b.Subscriber, func(msg *message.Message) error {
		key := msg.Metadata.Get("requestId")
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		if err := k.ledger.HSet(context.Background(), k.ledgerKey("started"), key, now).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "crash child: ledger:", err)
		}
		time.Sleep(time.Hour) // in the middle of the handler until SIGKILL
		return nil
	})
	return r.Run(context.Background())
}

// crash: a consumer in a child process claims keys and is killed with
// SIGKILL in the middle of its handlers. Two survivors (started after the
// kill) get the messages again from the broker: Kafka after the dead
// member's session times out, Redis Streams by XCLAIM after MaxIdleTime,
// RabbitMQ at once (the connection dropped), NATS after AckWait. They must
// not run a key before the dead consumer's lease expired, and must then run
// it, once.
func crash(e *env) {
	const n, survivors = 20, 2
	keys := keyNames("x", n)
	e.expectEffects("up", keys)
	startedHash := e.ledgerKey("started")
	child := e.startChild("crash", e.b.config(e.url, e.group, e.id+"-crashed"))
	e.publish(oneCopyEach(keys)...)

	e.waitFor("the child's handlers started", func() bool {
		n, _ := e.ledger.HLen(context.Background(), startedHash).Result()
		if n == 0 && child.exited() {
			e.t.Fatalf("crash child exited: %v: %s", child.err, child.output())
		}
		return n > 0
	})
	time.Sleep(500 * time.Millisecond) // let it take whatever else it will
	require.NoError(e.t, child.kill())
	startedAt, err := e.ledger.HGetAll(context.Background(), startedHash).Result()
	require.NoError(e.t, err)

	var effectAt sync.Map // key -> time.Time its survivor's handler ran
	e.handle(survivors, func(msg *message.Message) error {
		e.runs.Add(1)
		key := msg.Metadata.Get("requestId")
		effectAt.Store(key, time.Now())
		return e.effect(msg, "up", key)
	})
	e.note = func() string { return fmt.Sprintf("child killed in the handlers of %d keys", len(startedAt)) }
	e.requireExactlyOnce(tookOverAfterLease(startedAt, &effectAt))
}

// tookOverAfterLease checks that every key the dead child had started (at
// startedAt, Unix ms) was taken over by a survivor (effectAt), and not
// before the child's lease expired.
func tookOverAfterLease(startedAt map[string]string, effectAt *sync.Map) check {
	return func(t assert.TestingT) {
		assert.NotEmpty(t, startedAt, "the child was killed in the middle of a handler")
		for key, ms := range startedAt {
			at, err := strconv.ParseInt(ms, 10, 64)
			if !assert.NoError(t, err) {
				continue
			}
			v, ok := effectAt.Load(key)
			if !assert.True(t, ok, "key %s, orphaned by the child, was taken over", key) {
				continue
			}
			took := v.(time.Time)
			// The child claimed before its handler started, so its lease ran
			// out at most lease after `at`; 50 ms allow for the clocks of two
			// processes read at different moments of one host.
			waited := took.Sub(time.UnixMilli(at))
			assert.GreaterOrEqual(t, waited, lease-50*time.Millisecond,
				"key %s was taken over %v after the dead consumer started it: before its %v lease expired", key, waited, lease)
		}
	}
}
