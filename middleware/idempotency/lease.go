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

// Lease is one claim held by its owner, from Once.Claim: an adapter runs
// its work under Context and ends the lease with Complete or Fail. It
// renews itself every LeaseTTL/3 until then. When the store answers
// ErrLeaseLost, or no renewal has succeeded for nine tenths of the lease,
// the context returned by Context is cancelled with ErrLeaseLost as its
// cause, before the store can let anyone else claim the key.
//
// Renewals run on a timer (time.AfterFunc), not on a goroutine of their own:
// most work finishes long before LeaseTTL/3, and for it the lease costs one
// timer that never fires. They do not run under the claim's context: a
// subscriber that cancels a message's context (NATS after AckWait, many on
// Close) must not stop the renewals of a handler that is still running, or
// its copy would run beside it.
//
// Every store call of the owner is bounded by StoreTimeout and by what is
// left of the lease, counted from the start of the last claim or renewal
// that succeeded: the store counts it from when that call reached it, which
// is no earlier.
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
	// tx is what the lease knows of a COMPLETED that the work wrote in its
	// own transaction (completedInTransaction); txGen counts those
	// writes, so that a renewal tells whether it was sent after the last.
	tx       txCompletion
	txGen    uint64
	inflight sync.WaitGroup
	// cancelRenewal cancels the renewal in flight, if any.
	cancelRenewal context.CancelFunc
	// ended: the lease's context is cancelled, or will be as soon as it is
	// made (see leaseContext); endedLost: with ErrLeaseLost as its cause.
	ended, endedLost bool
}

// txCompletion is what a lease knows of a COMPLETED written inside the
// work's own transaction.
type txCompletion uint8

const (
	// txNone: no such write, or its transaction is known to have rolled
	// back (a renewal sent after it found the lease still held).
	txNone txCompletion = iota
	// txPending: the fenced write succeeded; whether its transaction
	// commits is not known yet. The lease goes on being renewed.
	txPending
	// txCommitted: a renewal found the key COMPLETED under the lease's own
	// token (ErrCompletedByOwner): the transaction committed and the lease
	// has ended, quietly.
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
	// The lease counts from before the claim's round trip, and so do its
	// renewals.
	l.timer = time.AfterFunc(o.cfg.LeaseTTL/3-time.Since(claimed), l.renew)
	l.mu.Unlock()
	return l
}

// Context is the context to run the work under: it ends when the claim's
// context does, or, with ErrLeaseLost as its cause (context.Cause), when the
// lease is lost. Complete and Fail cancel it.
func (l *Lease) Context() context.Context { return &l.ctx }

// leaseContext is the lease's context: context.WithCancelCause of the
// claim's context, carrying the lease's run for stores. The
// cancellable context is made when the work first asks for it (Done, Err,
// or a Value other than the run), already cancelled if the lease ended
// before: work that never looks at its context costs no context and no
// cancel function, and any other work sees what a context made at the
// claim would show it, cause included.
type leaseContext struct {
	lease *Lease // its dv.ctx is the parent: the claim's context
	// made is set, under lease.mu, once ctx and cancel are.
	made   atomic.Bool
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Deadline is the claim's context's: the lease adds none.
func (c *leaseContext) Deadline() (time.Time, bool) { return c.lease.dv.ctx.Deadline() }

func (c *leaseContext) Done() <-chan struct{} { return c.get().Done() }

func (c *leaseContext) Err() error { return c.get().Err() }

// Value answers the lease's run, and asks the cancellable context for
// anything else: context.Cause finds its cause that way.
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

// endLocked cancels the lease's context, with ErrLeaseLost as its cause
// when lost, unless it ended already; the caller holds l.mu.
func (l *Lease) endLocked(lost bool) {
	if l.ended {
		return
	}
	l.ended, l.endedLost = true, lost
	if l.ctx.made.Load() {
		l.ctx.cancel(l.endCauseLocked())
	}
}

// endCauseLocked is the cause the lease's context ended with: ErrLeaseLost,
// or nil for context.Canceled (Complete, Fail). The caller holds l.mu.
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

// Complete ends the renewals and moves the key to COMPLETED with result.
// A failed call is retried with backoff while the lease lasts, with the same
// token: a retry whose first try was applied but whose reply was lost
// succeeds (the store's transitions are idempotent for their owner). When
// the work wrote COMPLETED in its own transaction
// (completedInTransaction) and no renewal since has found that
// transaction rolled back, it writes nothing and returns nil: the work
// succeeded, so its transaction committed. It
// returns nil, an error matching ErrLeaseLost when the store says another
// owner took the key (or it was deleted), ErrCorruptRecord when the value
// under the key is not a record, or the last store error when the lease
// ran out before COMPLETED could be written: see OutcomeOf.
func (l *Lease) Complete(result []byte) error {
	l.stop()
	defer l.end()
	if l.txState() != txNone {
		return nil
	}
	o := l.o
	backoff := 20 * time.Millisecond
	var last error
	// The store counts CompletedTTL from when a Complete reaches it: no
	// earlier than this, also when a retry finds the first try applied.
	var sent time.Time
	if o.cache != nil {
		sent = time.Now()
	}
	for {
		if l.isLost() {
			return fmt.Errorf("idempotency: complete %q: %w", l.dv.key, ErrLeaseLost)
		}
		// An in-process store answers at once, so its first call cannot
		// outlive the lease: it fences by its own clock.
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
		// Retrying helps a store that is briefly unreachable, not one that
		// cannot read the record or runs in this process.
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

// Fail ends the renewals and moves the key to FAILED, so that the next
// claim runs the work again. Its error is logged, not returned for a retry:
// a lease that lapses counts as a failed attempt as well.
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

// renew runs on the timer: one renewal, then the next one is scheduled. A
// failed renewal is retried after a tenth of the lease, and no call outlasts
// the lease, so the work's context is cancelled before the store lets
// another owner claim the key (see giveUp).
//
// Renewals go on after the work wrote COMPLETED in its own transaction, and
// they are how the lease learns whether that transaction committed: the
// store's row lock makes a renewal sent after the fenced write wait for the
// transaction's end. ErrCompletedByOwner says it committed, and ends the
// lease quietly; a renewal that succeeds says it rolled back, and the lease
// goes on as if it had never been written.
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
			// Sent after the fenced write, it found the lease still held:
			// that transaction rolled back.
			l.tx = txNone
			o.logInfo("The transaction that wrote COMPLETED did not commit; the lease goes on", l.dv, nil)
		}
	case errors.Is(err, ErrCompletedByOwner):
		// The work's own transaction committed COMPLETED under this token:
		// nobody can claim the key, and there is nothing left to renew.
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

// lose ends the lease and cancels the work's context with ErrLeaseLost as
// its cause. byStore says the store refused the token. The caller holds l.mu.
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

// giveUp is when, with no renewal succeeding, the lease is declared lost:
// a tenth of the lease before the store expires it, so that the work's
// context is cancelled before another owner can claim the key. The caller
// holds l.mu.
func (l *Lease) giveUp() time.Time {
	ttl := l.o.cfg.LeaseTTL
	return l.renewed.Add(ttl - ttl/10)
}

// expiry is the earliest time the store may expire the lease: a lease
// after the start of the call that set it, less a millisecond, because a
// store counts in whole milliseconds of its own clock.
func (l *Lease) expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(l.o.cfg.LeaseTTL - time.Millisecond)
}

// stop ends the renewals: it cancels one in progress and waits for it to
// return, which a store honouring its context does at once; the lease is
// then bounded by the last renewal that succeeded. It may be called more
// than once.
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
