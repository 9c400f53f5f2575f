package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxBatches is how many pipelines of the auto-pipeliner may be on the wire
// at once: while one batch waits for its replies, calls queue up for the
// next, which the first free leader sends in one write. Two keep Redis busy
// between the batches of a loaded store (one is read while the other is
// parsed) without splitting the queue into many shallow batches. Measured
// (BenchmarkAutoPipelining, fresh messages at c64, 3 runs each): 1 slot
// 35.5-36.2 µs/op, 2 slots 31.9-32.7, 4 31.4-32.3, 8 31.6-31.9; without
// auto-pipelining 47.6-52.5.
const maxBatches = 2

// pipeliner sends the scripts of concurrent calls to Redis in batches
// (auto-pipelining). A call that finds a free slot goes out at once, on its
// own goroutine, by the path a store without auto-pipelining takes, so one
// caller's latency is unchanged. A call that finds every slot busy queues;
// the call that frees a slot hands the whole queue to the first waiter,
// which sends it as one pipeline and wakes the others with their replies.
// No goroutine of its own runs, and nothing waits for a batch to fill.
//
// Each call keeps its own command: a fresh message still costs two
// EVALSHAs and a duplicate one; only the round trips are shared. With
// replica acknowledgement a batch ends with one WAIT, which covers every
// script before it on the connection, instead of one WAIT per call.
type pipeliner struct {
	store *Store
	mu    sync.Mutex
	queue []*queuedCall
	// busy counts the batches on the wire, maxBatches at most.
	busy int
}

// queuedCall is one script call of a batch.
type queuedCall struct {
	ctx    context.Context
	op     string
	keys   []string
	script *redis.Script
	args   []any
	// wait: the call wants replica acknowledgement.
	wait bool
	// cmd is the reply.
	cmd *redis.Cmd
	// wake receives nil when cmd is set, or the batch the call must send
	// as the next leader.
	wake chan []*queuedCall
}

// run sends one script call, batched with those of other goroutines when
// the slots are busy, and returns its reply.
func (p *pipeliner) run(ctx context.Context, op, key string, script *redis.Script, wait bool, args []any) *redis.Cmd {
	c := &queuedCall{ctx: ctx, op: op, keys: []string{key}, script: script, args: args, wait: wait}
	p.mu.Lock()
	if p.busy < maxBatches && len(p.queue) == 0 {
		p.busy++
		p.mu.Unlock()
		c.cmd = p.store.runOne(ctx, op, c.keys, script, wait, args)
		p.next()
		return c.cmd
	}
	c.wake = make(chan []*queuedCall, 1)
	if p.busy < maxBatches { // a slot came free while others queued
		p.busy++
		batch := append(p.queue, c)
		p.queue = nil
		p.mu.Unlock()
		p.lead(c, batch)
		return c.cmd
	}
	p.queue = append(p.queue, c)
	p.mu.Unlock()

	select {
	case batch := <-c.wake:
		if batch != nil {
			p.lead(c, batch)
		}
		return c.cmd
	case <-ctx.Done():
	}
	p.mu.Lock()
	if i := slices.Index(p.queue, c); i >= 0 { // never sent: drop it
		p.queue = slices.Delete(p.queue, i, i+1)
		p.mu.Unlock()
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
	p.mu.Unlock()
	// Taken into a batch already: its deadline is no later than ctx's (see
	// send), or this call leads it; either way the reply comes in time.
	if batch := <-c.wake; batch != nil {
		p.lead(c, batch)
	}
	return c.cmd
}

// lead sends batch, which holds me, wakes its other calls with their
// replies and hands the slot on.
func (p *pipeliner) lead(me *queuedCall, batch []*queuedCall) {
	p.send(batch)
	for _, c := range batch {
		if c.wake != nil && c != me {
			c.wake <- nil
		}
	}
	p.next()
}

// next hands the slot of a finished batch to the first queued call, with the
// whole queue as its batch, or frees it.
func (p *pipeliner) next() {
	p.mu.Lock()
	if len(p.queue) == 0 {
		p.busy--
		p.mu.Unlock()
		return
	}
	batch := p.queue
	p.queue = nil
	p.mu.Unlock()
	batch[0].wake <- batch
}

// send runs batch in one pipeline. Its context has the earliest deadline of
// its calls, so that no call waits past its own, and none of their
// cancellations: a caller that gives up does not cut the others' replies.
// A call whose script the server did not know (NOSCRIPT) is sent again on
// its own, which loads the script.
func (p *pipeliner) send(batch []*queuedCall) {
	if len(batch) == 1 {
		c := batch[0]
		c.cmd = p.store.runOne(c.ctx, c.op, c.keys, c.script, c.wait, c.args)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	pipe := p.store.client.Pipeline()
	wait := false
	for _, c := range batch {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		wait = wait || c.wait
	}
	var waitCmd *redis.Cmd
	if wait {
		waitCmd = pipe.Do(ctx, "wait", p.store.ack.replicas, p.store.ack.waitTimeout(ctx).Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, c := range batch {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			c.cmd = p.store.runOne(c.ctx, c.op, c.keys, c.script, c.wait, c.args)
			continue
		}
		if c.wait && c.cmd.Err() == nil {
			acked, err := waitCmd.Int64()
			p.store.ack.count(c.op, c.keys[0], acked, err)
		}
	}
}

// batchContext is the context of one batch: the values of its first call's,
// none of the calls' cancellations, and the earliest of their deadlines.
func batchContext(batch []*queuedCall) (context.Context, context.CancelFunc) {
	var earliest time.Time
	for _, c := range batch {
		if d, ok := c.ctx.Deadline(); ok && (earliest.IsZero() || d.Before(earliest)) {
			earliest = d
		}
	}
	ctx := context.WithoutCancel(batch[0].ctx)
	if earliest.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, earliest)
}
