package main

import (
	"context"
	"errors"
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
	_ "github.com/idempotency/watermill-idempotency/backends/all"
	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"
	"github.com/idempotency/watermill-idempotency/internal/rediskeys"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Rate is one end-to-end cell: fresh messages through a Watermill router.
type Rate struct {
	Broker      string  `json:"broker"`
	Dedup       string  `json:"dedup"` // none, idem or floor
	Concurrency int     `json:"concurrency"`
	Messages    int64   `json:"messages"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"per_second"`
	// ClientCPU is this process's CPU per message (router, broker client,
	// middleware: getrusage), RedisCPU the store's Redis's (its main
	// thread), in µs, from the router's start to its close; zero where it
	// could not be read.
	ClientCPU float64 `json:"client_cpu_usec"`
	RedisCPU  float64 `json:"redis_cpu_usec"`
	Note      string  `json:"note,omitempty"`
}

// e2eDedups are the deduplications of the section: none, ours on Redis
// with the defaults, and the floor dedup.
var e2eDedups = []string{"none", "idem", "floor"}

func runE2E(o options) []Rate {
	rc := newClient(o.redisAddr, 256)
	defer rc.Close()
	defer func() {
		if err := rediskeys.Delete(context.Background(), rc, o.prefix+"*"); err != nil {
			log.Printf("clean up: %v", err)
		}
	}()
	var out []Rate
	for _, broker := range o.brokers {
		url := map[string]string{"gochannel": "gochannel://", "redis": "redis://" + o.redisAddr + "/0?pool_size=256",
			"amqp": o.amqpURL, "nats": o.natsURL}[broker]
		if broker == "kafka" {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(loopbackOnly))
			if err != nil {
				log.Fatalf("start in-process Kafka (kfake): %v", err)
			}
			defer c.Close()
			url = "kafka://" + strings.Join(c.ListenAddrs(), ",")
		}
		if url == "" {
			log.Fatalf("-brokers: unknown broker %q (want gochannel, kafka, redis, amqp, nats)", broker)
		}
		for _, c := range o.concurrency {
			for _, dedup := range e2eDedups {
				o.logf("e2e %s c=%d %s ...", broker, c, dedup)
				r := runCell(o, rc, broker, url, c, dedup)
				o.logf("  %.0f msg/s (%d in %.2fs) %s", r.PerSecond, r.Messages, r.Seconds, r.Note)
				out = append(out, r)
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

// runCell publishes o.n messages to new topics, then consumes them through
// a router and measures from the first handled message to the last.
// Concurrency c is how many messages the consumer may handle at once: c
// handlers on one topic in one group (Redis Streams, RabbitMQ, NATS), one
// handler on c partitions (Kafka), c handlers on c topics (gochannel).
func runCell(o options, rc *redis.Client, broker, url string, c int, dedup string) Rate {
	rt := Rate{Broker: broker, Dedup: dedup, Concurrency: c}
	group := fmt.Sprintf("%s-%s-c%d-%s", o.prefix, broker, c, dedup)
	chain := func(h message.HandlerFunc) message.HandlerFunc { return h }
	switch dedup {
	case "idem":
		// One scope for all handlers: a duplicate may reach any of them.
		chain = newMiddleware(idempotency.OnceConfig{Store: newStore(rc)}, idempotency.Config{KeyPrefix: group,
			Scope: func(*message.Message) string { return "bench" }}).Middleware
	case "floor":
		// Keys as long as ours (prefix:scope:key), OnceConfig's default lease
		// and TTL.
		chain = newFloorDedup(rc, group+":bench:", 40*time.Second, 24*time.Hour).Middleware
	}
	cfg := backends.Config{URL: url, Group: group, Consumer: "idembench"}
	topics, perTopic := []string{group + "-t0"}, c
	switch broker {
	case "gochannel":
		topics, perTopic = make([]string, c), 1
		for i := range topics {
			topics[i] = group + "-t" + strconv.Itoa(i)
		}
	case "kafka":
		cfg.URL, perTopic = cfg.URL+"?partitions="+strconv.Itoa(c), 1
	}
	defer cleanupTopics(o, broker, group, topics)
	be, err := backends.New(cfg, nil)
	if err != nil {
		rt.Note = err.Error()
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
	if err := publish(be.Publisher, topics, group, o.n); err != nil {
		rt.Note = "publish: " + err.Error()
		return rt
	}

	var count, first, last atomic.Int64
	all := make(chan struct{})
	h := chain(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	for ti, t := range topics {
		for i := range perTopic {
			router.AddConsumerHandler(fmt.Sprintf("h%d-%d", ti, i), t, be.Subscriber, func(msg *message.Message) error {
				if _, err := h(msg); err != nil {
					return err
				}
				now := time.Now().UnixNano()
				k := count.Add(1)
				if k == 1 {
					first.Store(now)
				}
				for l := last.Load(); now > l && !last.CompareAndSwap(l, now); l = last.Load() {
				}
				if k == int64(o.n) {
					close(all)
				}
				return nil
			})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cpu0, cpuOK := processCPU()
	redis0, redisOK := redisCPU(ctx, rc)
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-all:
	case <-time.After(o.phaseLimit):
		rt.Note = fmt.Sprintf("timed out after %v", o.phaseLimit)
	case err := <-runErr:
		rt.Note = fmt.Sprintf("router stopped: %v", err)
	}
	_ = router.Close()
	cpu1, _ := processCPU()
	redis1, redisOK1 := redisCPU(ctx, rc)

	rt.Messages = count.Load()
	if n := float64(rt.Messages); n > 1 {
		if cpuOK {
			rt.ClientCPU = (cpu1 - cpu0).Seconds() * 1e6 / n
		}
		if redisOK && redisOK1 {
			rt.RedisCPU = (redis1 - redis0) * 1e6 / n
		}
		rt.Seconds = time.Duration(last.Load() - first.Load()).Seconds()
		rt.PerSecond = div(n-1, rt.Seconds)
	}
	return rt
}

// publish sends n messages from 16 goroutines, message i to topic i mod
// len(topics) with requestId group-i, a new UUID each; it is not measured.
func publish(pub message.Publisher, topics []string, group string, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				key := group + "-" + strconv.Itoa(i)
				m := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+key+`"}`))
				m.Metadata.Set("requestId", key)
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

// cleanupTopics deletes what a cell left on shared brokers; gochannel and
// the in-process Kafka vanish with the process.
func cleanupTopics(o options, broker, group string, topics []string) {
	var err error
	switch broker {
	case "redis":
		c := newClient(o.redisAddr, 1)
		defer c.Close()
		err = c.Unlink(context.Background(), topics...).Err()
	case "amqp":
		err = brokeradmin.DeleteAMQP(o.amqpURL, topics, []string{group})
	case "nats":
		err = brokeradmin.DeleteNATSStreams(o.natsURL, topics...)
	}
	if err != nil {
		log.Printf("clean up %s topics: %v", broker, err)
	}
}

// floorDedup is the least a deduplication on Redis can send: SET key 1 NX
// PX lease before the handler (a key already there: acked as a duplicate),
// SET key done XX PX ttl after it succeeds, DEL key after it fails. No
// owner token, fencing, renewal or stored output: a cost reference, never a
// deduplication to use. Its commands ride the same go-redis auto-pipeliner
// as our store on the same client, so that it differs from ours by the
// commands it sends, not by their batching.
type floorDedup struct {
	ap         *redis.AutoPipeliner
	prefix     string
	lease, ttl time.Duration
}

// newFloorDedup returns the floor on rc. It creates a redisstore on rc
// first: go-redis keeps one auto-pipeliner per client, configured by its
// first caller, so the floor shares the one the store set up.
func newFloorDedup(rc *redis.Client, prefix string, lease, ttl time.Duration) floorDedup {
	_ = newStore(rc)
	ap, err := rc.AsyncAutoPipeline()
	if err != nil {
		log.Fatalf("floor: auto-pipelining: %v", err)
	}
	return floorDedup{ap: ap, prefix: prefix, lease: lease, ttl: ttl}
}

// Middleware deduplicates by the requestId metadata, else the UUID.
func (f floorDedup) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		id := msg.Metadata.Get("requestId")
		if id == "" {
			id = msg.UUID
		}
		key := f.prefix + id
		if fresh, err := f.send(ctx, "set", key, "1", "nx", "px", f.lease.Milliseconds()); !fresh || err != nil {
			return nil, err
		}
		out, err := h(msg)
		if err != nil {
			_, _ = f.send(context.WithoutCancel(ctx), "del", key)
			return nil, err
		}
		if _, err := f.send(ctx, "set", key, "done", "xx", "px", f.ttl.Milliseconds()); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// send runs one command through the auto-pipeliner and reports whether it
// answered something other than nil.
func (f floorDedup) send(ctx context.Context, args ...any) (bool, error) {
	err := f.ap.Submit(ctx, redis.NewCmd(ctx, args...)).WaitContext(ctx)
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}
