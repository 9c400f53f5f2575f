package main

// What every program needs around its handlers, kept here so that this
// directory builds alone when copied.

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// brokerFromEnv is backends.FromEnv with three defaults, so that the
// program runs without any setup: the in-process gochannel broker where
// BROKER_URL is unset, group where BROKER_GROUP is, and that group in
// AMQP.PublishGroups where BROKER_AMQP_PUBLISH_GROUPS is.
func brokerFromEnv(group string) (backends.Config, error) {
	cfg, err := backends.FromEnv()
	if err != nil {
		return cfg, err
	}
	if cfg.URL == "" {
		cfg.URL = "gochannel://"
	}
	if cfg.Group == "" {
		cfg.Group = group
	}
	if len(cfg.AMQP.PublishGroups) == 0 {
		// The program publishes to topics its own group consumes, at times
		// before that group ever subscribed: on RabbitMQ the group's queue
		// must exist first.
		cfg.AMQP.PublishGroups = []string{cfg.Group}
	}
	return cfg, nil
}

// newRouter returns a Watermill router with middlewares on every handler,
// whose Close gives the handlers in flight 10 s to finish, so that their
// outcome gets recorded, instead of the default 30 s.
func newRouter(logger watermill.LoggerAdapter, middlewares ...message.HandlerMiddleware) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(middlewares...)
	return router, nil
}

// outcomes is an idempotency.Observer that counts each outcome, whichever
// handler it came from. The zero value is ready to use.
type outcomes struct {
	mu     sync.Mutex
	counts map[idempotency.Outcome]int
}

// Outcome counts o.
func (c *outcomes) CacheLookup(string, bool) {}

func (c *outcomes) Outcome(_ context.Context, d idempotency.OutcomeDetails) {
	o := d.Outcome
	c.mu.Lock()
	if c.counts == nil {
		c.counts = map[idempotency.Outcome]int{}
	}
	c.counts[o]++
	c.mu.Unlock()
}

// StoreLatency ignores latencies.
func (c *outcomes) StoreLatency(string, time.Duration, error) {}

// Count returns how many of outcomes there were, summed.
func (c *outcomes) Count(outcomes ...idempotency.Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, o := range outcomes {
		n += c.counts[o]
	}
	return n
}
