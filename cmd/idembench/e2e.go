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

	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idempotency/watermill-idempotency/backends"
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
				r := e2eRun{o: o, broker: broker, url: url, c: c, dedup: dedup}
				id := fmt.Sprintf("%s-%s-c%d-%s", o.prefix, broker, c, dedup)
				r.group = id
				r.chain = func(h message.HandlerFunc) message.HandlerFunc { return h }
				if dedup == "idem" {
					// The defaults: auto-pipelining and the local cache on.
					idem := newIdempotency(idempotency.Config{Store: newRedisStore(rc, false), KeyPrefix: id,
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
				keys := make([]string, o.n)
				for i := range keys {
					keys[i] = id + "-" + strconv.Itoa(i)
				}
				for _, load := range []string{"fresh", "duplicate"} {
					o.logf("e2e %s c=%d %s %s ...", broker, c, dedup, load)
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
					o.logf("  %.0f msg/s (%d in %.2fs) %s", rt.PerSecond, rt.Messages, rt.Seconds, rt.Note)
				}
			}
		}
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
	// gochannel: c topics with a handler each; Kafka: one topic of c
	// partitions, one handler; the others: one topic, c competing handlers.
	nTopics, handlersPerTopic := 1, r.c
	switch r.broker {
	case "gochannel":
		nTopics, handlersPerTopic = r.c, 1
	case "kafka":
		handlersPerTopic = 1
	}
	topics := make([]string, nTopics)
	for i := range topics {
		topics[i] = topicBase + "-t" + strconv.Itoa(i)
	}
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

	n := int64(len(keys))
	var handled, first, last atomic.Int64
	all := make(chan struct{})
	chain := r.chain(noop)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	for ti, t := range topics {
		for h := range handlersPerTopic {
			router.AddConsumerHandler(fmt.Sprintf("h%d-%d", ti, h), t, be.Subscriber, func(msg *message.Message) error {
				if _, err := chain(msg); err != nil {
					return err
				}
				now := time.Now().UnixNano()
				switch k := handled.Add(1); {
				case k == 1:
					first.Store(now)
				case k == n:
					close(all)
				}
				for {
					l := last.Load()
					if now <= l || last.CompareAndSwap(l, now) {
						break
					}
				}
				return nil
			})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-all:
	case <-time.After(r.o.phaseLimit):
		rt.Note = fmt.Sprintf("timed out after %v", r.o.phaseLimit)
	case err := <-runErr:
		rt.Note = fmt.Sprintf("router stopped: %v", err)
	}
	_ = router.Close()

	rt.Messages = handled.Load()
	if rt.Messages > 1 {
		rt.Seconds = time.Duration(last.Load() - first.Load()).Seconds()
		if rt.Seconds > 0 {
			rt.PerSecond = float64(rt.Messages-1) / rt.Seconds
		}
	}
	return rt
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
