package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idempotency/watermill-idempotency/backends"
	_ "github.com/idempotency/watermill-idempotency/backends/all"
	"github.com/idempotency/watermill-idempotency/internal/brokeradmin"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// e2eRun is one broker at one concurrency, with or without the middleware.
type e2eRun struct {
	o      options
	rc     *redis.Client // the store's Redis, whose CPU is counted
	broker string
	url    string
	c      int
	dedup  string // one of e2eDedups
	chain  message.HandlerMiddleware
	idem   *idempotency.Middleware // nil without the middleware
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
			for _, dedup := range e2eDedups {
				out = append(out, newE2ERun(o, rc, broker, url, c, dedup).loads()...)
			}
		}
	}
	return out
}

// e2eDedups are the deduplications of the end-to-end section: none, ours
// on Redis with the defaults (idem), and the floor (floorDedup): the two
// plain Redis commands a message needs at least, auto-pipelined like ours.
var e2eDedups = []string{"none", "idem", "floor"}

// newE2ERun sets up one run: its consumer group, its middleware chain (the
// middleware on Redis with the defaults when dedup is "idem", the floor
// when "floor", nothing otherwise) and its broker config.
func newE2ERun(o options, rc *redis.Client, broker, url string, c int, dedup string) e2eRun {
	r := e2eRun{o: o, rc: rc, broker: broker, url: url, c: c, dedup: dedup}
	r.group = fmt.Sprintf("%s-%s-c%d-%s", o.prefix, broker, c, dedup)
	r.chain = func(h message.HandlerFunc) message.HandlerFunc { return h }
	switch dedup {
	case "idem":
		// The defaults: auto-pipelining and the local cache on.
		idem := newIdempotency(idemConfig{Store: newRedisStore(rc, false), KeyPrefix: r.group,
			// One scope for all c handlers: a duplicate may reach any of them.
			Scope: func(*message.Message) string { return "bench" }}, false)
		r.chain, r.idem = idem.Middleware, idem
	case "floor":
		// Keys as long as ours (prefix:scope:key), the same lease and TTL
		// (OnceConfig's defaults).
		r.chain = newFloorDedup(rc, r.group+":bench:", 40*time.Second, 24*time.Hour).Middleware
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
