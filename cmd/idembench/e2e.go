package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// publishers is how many goroutines publish a phase's messages before the
// router starts; publishing is not measured.
const publishers = 16

// e2eRun is one broker at one concurrency, with or without the middleware.
type e2eRun struct {
	o      options
	broker string
	url    string
	c      int
	dedup  string // "none" or "idem"
	chain  message.HandlerMiddleware
	idem   *idempotency.Idempotency // nil without the middleware
	group  string
	cfg    backends.Config
}

func runE2E(o options, rc *redis.Client) []Rate {
	var out []Rate
	var kafkaAddrs []string
	for _, broker := range o.brokers {
		url := ""
		switch broker {
		case "gochannel":
			url = "gochannel://"
		case "kafka":
			if kafkaAddrs == nil {
				c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(1), kfake.ListenFn(loopbackOnly))
				if err != nil {
					log.Fatalf("start in-process Kafka (kfake): %v", err)
				}
				defer c.Close()
				kafkaAddrs = c.ListenAddrs()
			}
			url = "kafka://" + strings.Join(kafkaAddrs, ",")
		case "redis":
			url = "redis://" + o.redisAddr + "/0?pool_size=256"
		case "amqp":
			url = o.amqpURL
		case "nats":
			url = o.natsURL
		default:
			log.Fatalf("unknown broker %q (want gochannel, kafka, redis, amqp, nats)", broker)
		}
		for _, c := range o.concurrency {
			for _, dedup := range []string{"none", "idem"} {
				out = append(out, newE2ERun(o, rc, broker, url, c, dedup).loads()...)
			}
		}
	}
	return out
}

// newE2ERun sets up one run: its consumer group, its middleware chain (the
// middleware on Redis with the defaults when dedup is "idem", nothing
// otherwise) and its broker config.
func newE2ERun(o options, rc *redis.Client, broker, url string, c int, dedup string) e2eRun {
	r := e2eRun{o: o, broker: broker, url: url, c: c, dedup: dedup}
	r.group = fmt.Sprintf("%s-%s-c%d-%s", o.prefix, broker, c, dedup)
	r.chain = func(h message.HandlerFunc) message.HandlerFunc { return h }
	if dedup == "idem" {
		// The defaults: auto-pipelining and the local cache on.
		idem := newIdempotency(idempotency.Config{Store: newRedisStore(rc, false), KeyPrefix: r.group,
			// One scope for all c handlers: a duplicate may reach any of them.
			Scope: func(*message.Message) string { return "bench" }}, false)
		r.chain, r.idem = idem.Middleware, idem
	}
	r.cfg = backends.Config{URL: url, Group: r.group, Consumer: "idembench", NackResendSleep: 100 * time.Millisecond,
		DialTimeout: 10 * time.Second}
	r.cfg.Kafka.Partitions = 1
	if broker == "kafka" {
		r.cfg.Kafka.Partitions = int32(c)
	}
	return r
}

// loads runs the fresh phase, then the duplicate phase with the same keys,
// and counts the middleware's cache hits and misses of each.
func (r e2eRun) loads() []Rate {
	id := r.group
	keys := make([]string, r.o.n)
	for i := range keys {
		keys[i] = id + "-" + strconv.Itoa(i)
	}
	var out []Rate
	for _, load := range []string{"fresh", "duplicate"} {
		r.o.logf("e2e %s c=%d %s %s ...", r.broker, r.c, r.dedup, load)
		var hits0, misses0 uint64
		if r.idem != nil {
			hits0, misses0 = cacheCounts(r.idem)
		}
		rt := r.phase(id+"-"+load, keys)
		rt.Load = load
		if r.idem != nil {
			hits, misses := cacheCounts(r.idem)
			rt.CacheHits, rt.CacheMisses = hits-hits0, misses-misses0
		}
		out = append(out, rt)
		r.o.logf("  %.0f msg/s (%d in %.2fs) %s", rt.PerSecond, rt.Messages, rt.Seconds, rt.Note)
	}
	return out
}

func loopbackOnly(network, address string) (net.Listener, error) {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	return net.Listen(network, net.JoinHostPort("127.0.0.1", port))
}

// phase publishes one message per key to fresh topics, then consumes them
// through a router and measures from the first handled message to the last.
func (r e2eRun) phase(topicBase string, keys []string) Rate {
	rt := Rate{Section: "e2e", Broker: r.broker, Dedup: r.dedup, Concurrency: r.c}
	topics, handlersPerTopic := r.topics(topicBase)
	defer r.cleanupTopics(topics)

	be, err := backends.New(r.cfg, nil)
	if err != nil {
		rt.Note = err.Error()
		log.Printf("%s: %v", r.broker, err)
		return rt
	}
	defer be.Close()
	if init, ok := be.Subscriber.(message.SubscribeInitializer); ok {
		for _, t := range topics {
			if err := init.SubscribeInitialize(t); err != nil {
				rt.Note = err.Error()
				return rt
			}
		}
	}
	if err := publish(be.Publisher, topics, keys); err != nil {
		rt.Note = "publish: " + err.Error()
		log.Printf("%s: %v", r.broker, err)
		return rt
	}
	r.consume(&rt, be.Subscriber, topics, handlersPerTopic, int64(len(keys)))
	return rt
}

// topics names the topics of a phase and says how many handlers consume each.
// gochannel: c topics with a handler each; Kafka: one topic of c partitions,
// one handler; the others: one topic, c competing handlers.
func (r e2eRun) topics(topicBase string) (topics []string, handlersPerTopic int) {
	nTopics := 1
	handlersPerTopic = r.c
	switch r.broker {
	case "gochannel":
		nTopics, handlersPerTopic = r.c, 1
	case "kafka":
		handlersPerTopic = 1
	}
	topics = make([]string, nTopics)
	for i := range topics {
		topics[i] = topicBase + "-t" + strconv.Itoa(i)
	}
	return topics, handlersPerTopic
}

// consume runs a router with handlersPerTopic handlers on each topic until it
// has handled n messages, the phase times out or the router stops, and puts
// the count and the rate into rt (and why it stopped early into rt.Note).
func (r e2eRun) consume(rt *Rate, sub message.Subscriber, topics []string, handlersPerTopic int, n int64) {
	clock := &phaseClock{n: n, all: make(chan struct{})}
	chain := r.chain(noop)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	for ti, t := range topics {
		for h := range handlersPerTopic {
			router.AddConsumerHandler(fmt.Sprintf("h%d-%d", ti, h), t, sub, func(msg *message.Message) error {
				if _, err := chain(msg); err != nil {
					return err
				}
				clock.handled()
				return nil
			})
		}
	}
	rt.Note = r.runRouter(router, clock.all)

	rt.Messages = clock.count.Load()
	if rt.Messages > 1 {
		rt.Seconds = time.Duration(clock.last.Load() - clock.first.Load()).Seconds()
		if rt.Seconds > 0 {
			rt.PerSecond = float64(rt.Messages-1) / rt.Seconds
		}
	}
}

// runRouter runs router until all is closed, the phase times out or the
// router stops, then closes it; it returns why the phase ended early, or "".
func (r e2eRun) runRouter(router *message.Router, all <-chan struct{}) string {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	note := ""
	select {
	case <-all:
	case <-time.After(r.o.phaseLimit):
		note = fmt.Sprintf("timed out after %v", r.o.phaseLimit)
	case err := <-runErr:
		note = fmt.Sprintf("router stopped: %v", err)
	}
	_ = router.Close()
	return note
}

// phaseClock counts the messages a phase has handled and keeps the times
// (Unix nanoseconds) of the first and of the latest.
type phaseClock struct {
	n                  int64         // messages of the phase
	all                chan struct{} // closed at the n-th message
	count, first, last atomic.Int64
}

// handled counts one handled message, from any handler goroutine.
func (pc *phaseClock) handled() {
	now := time.Now().UnixNano()
	k := pc.count.Add(1)
	if k == 1 {
		pc.first.Store(now)
	}
	if k == pc.n { // also when the phase has one message
		close(pc.all)
	}
	for {
		l := pc.last.Load()
		if now <= l || pc.last.CompareAndSwap(l, now) {
			break
		}
	}
}

// publish sends one message per key, key i to topic i mod len(topics), from
// several goroutines. The key travels as requestId; the UUID is new, as it
// would be for a producer's retry.
func publish(pub message.Publisher, topics, keys []string) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for range publishers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				m := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+keys[i]+`"}`))
				m.Metadata.Set("requestId", keys[i])
				if err := pub.Publish(topics[i%len(topics)], m); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// cleanupTopics deletes what a phase left on shared brokers: Redis streams,
// RabbitMQ queues and exchanges, NATS streams. gochannel and the in-process
// Kafka vanish with the process. A failure is logged: the run goes on.
func (r e2eRun) cleanupTopics(topics []string) {
	var err error
	switch r.broker {
	case "redis":
		c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: r.o.redisAddr})
		defer c.Close()
		err = c.Unlink(context.Background(), topics...).Err()
	case "amqp":
		err = brokeradmin.DeleteAMQP(r.o.amqpURL, topics, []string{r.group})
	case "nats":
		err = brokeradmin.DeleteNATSStreams(r.o.natsURL, topics...)
	}
	if err != nil {
		log.Printf("clean up %s topics: %v", r.broker, err)
	}
}
