package main

// What every program needs around its handlers, kept here so that this
// directory builds alone when copied.

import (
	"context"
	"sync"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

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

// All returns a copy of every count so far.
func (c *outcomes) All() map[idempotency.Outcome]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	all := make(map[idempotency.Outcome]int, len(c.counts))
	for o, n := range c.counts {
		all[o] = n
	}
	return all
}
