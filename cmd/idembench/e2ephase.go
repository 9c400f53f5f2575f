package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends"
)

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
	cpu0, cpuOK := processCPU()
	redisCPU0, reads0, ok0 := r.redisUsage()
	rt.Note = r.runRouter(router, clock.all)
	cpu1, _ := processCPU()
	redisCPU1, reads1, ok1 := r.redisUsage()

	rt.Messages = clock.count.Load()
	if n := float64(rt.Messages); n > 0 {
		if cpuOK {
			rt.ClientCPU = (cpu1 - cpu0).Seconds() * 1e6 / n
		}
		if ok0 && ok1 {
			rt.RedisCPU = (redisCPU1 - redisCPU0) * 1e6 / n
			rt.RedisReads = (reads1 - reads0) / n
		}
	}
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

// publishers is how many goroutines publish a phase's messages before the
// router starts; publishing is not measured.
const publishers = 16

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

// redisUsage is what INFO says of the store's Redis so far: the CPU
// seconds it used (its main thread where it tells) and how many reads from
// its clients' connections it processed (each a batch of commands, one or
// more); ok is false when it cannot be read.
func (r e2eRun) redisUsage() (cpu, reads float64, ok bool) {
	info, err := r.rc.Info(context.Background(), "cpu", "stats").Result()
	if err != nil {
		return 0, 0, false
	}
	cpu, ok = parseCPU(info)
	for line := range strings.SplitSeq(info, "\n") {
		if v, found := strings.CutPrefix(strings.TrimSpace(line), "total_reads_processed:"); found {
			reads, err = strconv.ParseFloat(v, 64)
			return cpu, reads, ok && err == nil
		}
	}
	return 0, 0, false
}
