package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// Lease is one claim held by its owner, from [Once.Claim]: run the work
// under Context, then call Complete or Fail. It renews itself every
// LeaseTTL/3. When the store answers ErrLeaseLost, or no renewal succeeded
// for nine tenths of the lease, Context is cancelled with cause
// [ErrLeaseLost], before anyone else can claim the key.
//
// Renewals run on a timer, not under the claim's context: a subscriber that
// cancels a message's context must not stop a running handler's renewals.
// Every store call is bounded by StoreTimeout and by what is left of the
// lease.
type Lease struct {
	o      *Once
	ctx    leaseContext
	idem   *Middleware // the Watermill middleware running the handler, or nil
	do     bool        // the run is Once.Do's
	token  string
	dv     delivery // dv.key is the key, dv.ctx the claim's context
	record leaseRecord

	mu      sync.Mutex
	timer   *time.Timer
	renewed time.Time // start of the claim, or of the last successful renewal
	stopped bool      // Complete or Fail was called, or the lease ended
	lost    bool      // the store said the token no longer holds the key
	// tx: a COMPLETED the work wrote in its own transaction; txGen counts
	// those writes, so a renewal tells whether it was sent after the last.
	tx       txCompletion
	txGen    uint64
	inflight sync.WaitGroup
	// cancelRenewal cancels the renewal in flight, if any.
	cancelRenewal context.CancelFunc
	// ended: the context is cancelled, or will be once made; endedLost:
	// with cause ErrLeaseLost.
	ended, endedLost bool
}

// txCompletion is what a lease knows of a COMPLETED written in the work's
// own transaction.
type txCompletion uint8

const (
	// txNone: no such write, or it rolled back (a later renewal succeeded).
	txNone txCompletion = iota
	// txPending: the fenced write succeeded; its commit is not known yet.
	txPending
	// txCommitted: a renewal got ErrCompletedByOwner; the lease ended quietly.
	txCommitted
)

// leaseRecord is what the cache keeps of the claimed record.
type leaseRecord struct {
	attempts                          int
	fingerprint                       []byte
	created, updated, leaseExpiration time.Time
}

func (o *Once) newLease(parent context.Context, key, token string, claimed time.Time, dv delivery) *Lease {
	dv.key, dv.ctx = key, parent
	l := &Lease{o: o, token: token, dv: dv, renewed: claimed}
	l.ctx.lease = l
	l.mu.Lock()
	l.timer = time.AfterFunc(o.cfg.LeaseTTL/3-time.Since(claimed), l.renew)
	l.mu.Unlock()
	return l
}

// Context is the work's context: it ends with the claim's context, with
// cause ErrLeaseLost when the lease is lost, and at Complete or Fail.
func (l *Lease) Context() context.Context { return &l.ctx }

// leaseContext is context.WithCancelCause of the claim's context, made when
// the work first asks for it (already cancelled if the lease ended), so work
// that never looks costs no context. It carries the lease's run for stores.
type leaseContext struct {
	lease  *Lease      // its dv.ctx is the parent: the claim's context
	made   atomic.Bool // set under lease.mu once ctx and cancel are
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Deadline is the claim's context's: the lease adds none.
func (c *leaseContext) Deadline() (time.Time, bool) { return c.lease.dv.ctx.Deadline() }

func (c *leaseContext) Done() <-chan struct{} { return c.get().Done() }

func (c *leaseContext) Err() error { return c.get().Err() }

// Value answers the lease's run, and asks the cancellable context for the rest.
func (c *leaseContext) Value(key any) any {
	if key == (storekit.RunKey{}) {
		return c.lease.storeRun()
	}
	return c.get().Value(key)
}

// storeRun is the run a store's transactional completion writes for: only
// the middleware's and Once.Do's, whose stored result the work knows.
func (l *Lease) storeRun() any {
	if l.idem == nil && !l.do {
		return nil
	}
	stores := []any{l.o.cfg.Store}
	for st := l.o.cfg.Store; len(stores) < 64; { // a bound, in case a wrapper unwraps to itself
		u, ok := st.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		if st = u.Unwrap(); st == nil {
			break
		}
		stores = append(stores, st)
	}
	return storekit.NewRun(l.dv.key, l.token, l.o.cfg.CompletedTTL, stores, l.result, l.completedInTransaction)
}

// result is what COMPLETED stores for out: as the middleware stores it, or,
// for Once.Do's work, its encoding with no bound.
func (l *Lease) result(out []*message.Message) []byte {
	if l.idem != nil {
		result, _ := l.idem.encodeResult(out)
		return result
	}
	if len(out) == 0 {
		return nil
	}
	return storekit.EncodeOutput(out)
}

// completedInTransaction: the work wrote COMPLETED in its own transaction.
// Until a renewal tells that it committed, the lease is kept.
func (l *Lease) completedInTransaction() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tx != txCommitted {
		l.tx = txPending
	}
	l.txGen++
}

// get returns the cancellable context, making it on first use.
func (c *leaseContext) get() context.Context {
	if c.made.Load() {
		return c.ctx
	}
	l := c.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.made.Load() {
		c.ctx, c.cancel = context.WithCancelCause(l.dv.ctx)
		if l.ended {
			c.cancel(l.endCauseLocked())
		}
		c.made.Store(true)
	}
	return c.ctx
}

// endLocked cancels the lease's context once, with cause ErrLeaseLost when
// lost. The caller holds l.mu.
func (l *Lease) endLocked(lost bool) {
	if l.ended {
		return
	}
	l.ended, l.endedLost = true, lost
	if l.ctx.made.Load() {
		l.ctx.cancel(l.endCauseLocked())
	}
}

// endCauseLocked is ErrLeaseLost, or nil. The caller holds l.mu.
func (l *Lease) endCauseLocked() error {
	if l.endedLost {
		return ErrLeaseLost
	}
	return nil
}

// end is endLocked for Complete and Fail, which do not hold l.mu.
func (l *Lease) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(false)
}

// Complete ends the renewals and moves the key to COMPLETED with result. A
// failed call is retried with backoff while the lease lasts. It writes
// nothing when the work's own transaction wrote COMPLETED. It returns nil,
// [ErrLeaseLost], [ErrCorruptRecord], or the last store error when the lease
// ran out: see [OutcomeOf].
func (l *Lease) Complete(result []byte) error {
	l.stop()
	defer l.end()
	if l.txState() != txNone {
		return nil
	}
	o := l.o
	backoff := 20 * time.Millisecond
	var last error
	// The store counts CompletedTTL from no earlier than this.
	var sent time.Time
	if o.cache != nil {
		sent = time.Now()
	}
	for {
		if l.isLost() {
			return fmt.Errorf("idempotency: complete %q: %w", l.dv.key, ErrLeaseLost)
		}
		// An in-process store fences by its own clock.
		left := time.Until(l.expiry())
		if left <= 0 && (last != nil || !o.inProcess) {
			if last == nil {
				last = errors.New("no time was left")
			}
			return fmt.Errorf("idempotency: COMPLETED not written within the lease: %w", last)
		}
		ctx, cancel := o.storeCtx(context.Background(), min(o.cfg.StoreTimeout, left))
		start := o.startTimer()
		err := o.cfg.Store.Complete(ctx, l.dv.key, l.token, result, o.cfg.CompletedTTL)
		cancel()
		o.observe("complete", start, err)
		if err == nil {
			l.cacheCompleted(result, sent)
			return nil
		}
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrCorruptRecord) || o.inProcess {
			return err
		}
		last = err
		o.logInfo("Could not write COMPLETED; retrying within the lease", l.dv, watermill.LogFields{"err": err})
		time.Sleep(min(backoff, max(time.Until(l.expiry()), 0)))
		backoff = min(2*backoff, time.Second)
	}
}

// Fail ends the renewals and moves the key to FAILED, so the next claim runs
// the work again. Its error is logged: a lapsed lease fails the attempt too.
func (l *Lease) Fail() {
	l.stop()
	defer l.end()
	o := l.o
	if l.txState() == txCommitted {
		o.logInfo("Failed attempt not recorded: the work's own transaction committed COMPLETED", l.dv, nil)
		return
	}
	left := time.Until(l.expiry())
	if l.isLost() || left <= 0 && !o.inProcess {
		o.logInfo("Failed attempt not recorded: the lease is over; it counts as failed when it lapses", l.dv, nil)
		return
	}
	ctx, cancel := o.storeCtx(context.Background(), min(o.cfg.StoreTimeout, left))
	defer cancel()
	start := o.startTimer()
	err := o.cfg.Store.Fail(ctx, l.dv.key, l.token, o.cfg.FailedTTL)
	o.observe("fail", start, err)
	switch {
	case errors.Is(err, ErrLeaseLost):
		o.logInfo("Failed attempt not recorded: the lease was already lost", l.dv, nil)
	case err != nil:
		o.logError("Could not record a failed attempt; it counts as failed when its lease lapses", err, l.dv)
	}
}

// renew runs on the timer: one renewal, then the next is scheduled. A
// failed one is retried after a tenth of the lease; no call outlasts it.
//
// After a transactional COMPLETED, the store's row lock makes a renewal wait
// for the transaction: ErrCompletedByOwner says it committed (the lease ends
// quietly), success says it rolled back (the lease goes on).
func (l *Lease) renew() {
	o := l.o
	ttl := o.cfg.LeaseTTL
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	left := time.Until(l.giveUp())
	if left <= 0 {
		l.lose(errors.New("no renewal succeeded within the lease"), false)
		l.mu.Unlock()
		return
	}
	l.inflight.Add(1)
	rctx, rcancel := context.WithTimeout(context.Background(), min(o.cfg.StoreTimeout, ttl/3, left))
	l.cancelRenewal = rcancel
	gen := l.txGen
	l.mu.Unlock()
	defer l.inflight.Done()

	start := time.Now()
	err := o.cfg.Store.Renew(rctx, l.dv.key, l.token, ttl)
	rcancel()
	o.observe("renew", start, err)

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	next := ttl / 3
	switch {
	case err == nil:
		l.renewed = start
		if l.tx == txPending && gen == l.txGen {
			l.tx = txNone
			o.logInfo("The transaction that wrote COMPLETED did not commit; the lease goes on", l.dv, nil)
		}
	case errors.Is(err, ErrCompletedByOwner):
		l.tx = txCommitted
		l.stopped = true
		return
	case errors.Is(err, ErrLeaseLost):
		l.lose(err, true)
		return
	default:
		o.logInfo("Lease renewal failed; retrying", l.dv, watermill.LogFields{"err": err})
		next = max(min(ttl/10, time.Until(l.giveUp())), 0)
	}
	l.timer.Reset(next)
}

// lose ends the lease with cause ErrLeaseLost; byStore: the store refused
// the token. The caller holds l.mu.
func (l *Lease) lose(err error, byStore bool) {
	l.stopped = true
	l.lost = byStore
	l.o.logError("Lease lost while the work runs; cancelling its context", err, l.dv)
	l.endLocked(true)
}

func (l *Lease) txState() txCompletion {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tx
}

func (l *Lease) isLost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// giveUp is when, with no renewal succeeding, the lease is declared lost: a
// tenth of the lease before the store expires it. The caller holds l.mu.
func (l *Lease) giveUp() time.Time {
	ttl := l.o.cfg.LeaseTTL
	return l.renewed.Add(ttl - ttl/10)
}

// expiry is the earliest the store may expire the lease, less a millisecond
// for a store that counts whole milliseconds.
func (l *Lease) expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(l.o.cfg.LeaseTTL - time.Millisecond)
}

// stop ends the renewals, cancelling one in progress and waiting for it. It
// may be called more than once.
func (l *Lease) stop() {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	if l.cancelRenewal != nil {
		l.cancelRenewal()
	}
	l.mu.Unlock()
	l.inflight.Wait()
}
