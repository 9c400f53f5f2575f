package killtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/redisbackend" // the consumers read Redis Streams
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// consumerVar holds, in a consumer process, its Consumer as JSON.
const consumerVar = "KILLTEST_CONSUMER"

// Timers of the kill test, in production's order (NackDelay < NackResendSleep
// < lease < MaxIdleTime) but scaled down so that a dead consumer's key and
// message are taken over within a second.
const (
	lease      = 400 * time.Millisecond
	nackDelay  = 50 * time.Millisecond
	nackResend = 100 * time.Millisecond
	idle       = 500 * time.Millisecond // Redis Streams MaxIdleTime
	claimEvery = 200 * time.Millisecond // Redis Streams ClaimInterval
	// handlerName is the router handler's name, the scope of the keys.
	handlerName = "kill"
)

// Window is how long the consumer stays in each window, so that a SIGKILL
// sent when it announces the window lands inside it.
const Window = 20 * time.Millisecond

// The windows a consumer is killed in.
const (
	PhaseStart     = "start"     // claimed, effect not made
	PhaseEffect    = "effect"    // effect made, not committed
	PhaseCommitted = "committed" // effect and COMPLETED committed, message not acked
)

// phases are the windows in the order of a message's handling.
var phases = []string{PhaseStart, PhaseEffect, PhaseCommitted}

var phaseNames = map[string]string{
	PhaseStart:     "before effect",
	PhaseEffect:    "between effect and commit",
	PhaseCommitted: "after commit",
}

// Consumer is what a consumer process is told of its run.
type Consumer struct {
	// Kind names the store, as Setup.Kind does.
	Kind string
	// Table is the store's table (Setup.Table), empty for a store without one.
	Table string
	// Effects is the effects table (Setup.Effects).
	Effects string
	// Redis is the address of the Redis server of the broker, and of a
	// store on Redis.
	Redis string
	// Broker is the broker's URL, Topic and Group its stream and consumer
	// group, and Prefix the middleware's key prefix: the run's own.
	Broker, Topic, Group, Prefix string

	stdout sync.Mutex
}

// ConsumerFromEnv returns the Consumer this process was started as, and
// false when it was not started as one (it is the test).
func ConsumerFromEnv() (*Consumer, bool) {
	v := os.Getenv(consumerVar)
	if v == "" {
		return nil, false
	}
	c := new(Consumer)
	if err := json.Unmarshal([]byte(v), c); err != nil {
		fmt.Fprintln(os.Stderr, "kill child:", consumerVar, err)
		os.Exit(2)
	}
	return c, true
}

// Say announces on stdout that the consumer entered phase for key.
func (c *Consumer) Say(phase, key string) {
	c.stdout.Lock()
	defer c.stdout.Unlock()
	fmt.Fprintln(os.Stdout, phase, key) // unbuffered: one write per line
}

// Exit is the process's exit code after err, which it writes to stderr:
// 0 for nil, else 2.
func (c *Consumer) Exit(err error) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "kill child:", err)
	return 2
}

// ranKey marks, in the context the outer middleware gives each message,
// that the handler ran for it: a duplicate's ack is no "committed".
type ranKey struct{}

// Consume consumes the topic under the idempotency middleware on store
// until the process is killed. For each message it announces PhaseStart,
// stays in that window, and runs effect with the message's key: effect
// makes one row in the effects table, announces PhaseEffect with Say once
// the row is made, and stays in that window (Window in all) before the
// completion is committed. Once COMPLETED is committed and before the
// message is acked, Consume announces PhaseCommitted and stays in that
// window.
func (c *Consumer) Consume(store idempotency.Store, effect func(ctx context.Context, key string) error) error {
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, LeaseTTL: lease, StoreTimeout: time.Second, Logger: logger})
	if err != nil {
		return err
	}
	idem, err := idempotency.New(once, &idempotency.Config{KeyPrefix: c.Prefix, NackDelay: nackDelay})
	if err != nil {
		return err
	}
	b, err := backends.New(brokerConfig(c.Broker, c.Group), logger)
	if err != nil {
		return err
	}
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	handler := func(msg *message.Message) error {
		if p, ok := msg.Context().Value(ranKey{}).(*bool); ok {
			*p = true
		}
		key := msg.Metadata.Get("requestId")
		c.Say(PhaseStart, key)
		time.Sleep(Window)
		return effect(msg.Context(), key)
	}
	// Outside the idempotency middleware: it sees the message after
	// COMPLETED was committed and before the router acks it.
	announceCommitted := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ran := new(bool)
			msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
			out, err := h(msg)
			if err == nil && *ran {
				c.Say(PhaseCommitted, msg.Metadata.Get("requestId"))
				time.Sleep(Window)
			}
			return out, err
		}
	}
	r.AddMiddleware(announceCommitted, idem.Middleware)
	r.AddConsumerHandler(handlerName, c.Topic, b.Subscriber, handler)
	return r.Run(context.Background())
}

// brokerConfig is the Redis Streams configuration of the consumers and of
// the publisher. Every consumer has the same name, as a restarted pod has:
// the messages its predecessor held stay pending under that name and are
// claimed again (by itself) once idle for idle.
func brokerConfig(url, group string) backends.Config {
	return backends.Config{
		URL:             url,
		Group:           group,
		Consumer:        "kill-consumer",
		NackResendSleep: nackResend,
		Redis:           backends.RedisConfig{MaxIdleTime: idle, ClaimInterval: claimEvery},
	}
}
