package middleware

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// lease renews one claim every LeaseTTL/3 while its handler runs. When the
// store answers ErrLeaseLost, or no renewal has succeeded for nine tenths of
// the lease (see giveUp), the handler's context is cancelled with
// ErrLeaseLost as its cause.
//
// Renewals run on a timer (time.AfterFunc), not on a goroutine of their own:
// most handlers finish long before LeaseTTL/3, and for them the lease costs
// one timer that never fires instead of a goroutine, a ticker and two
// channels per message.
type lease struct {
	d      *Idempotency
	cancel context.CancelCauseFunc // cancels the handler's context
	key    string
	scope  string
	token  string

	mu       sync.Mutex
	timer    *time.Timer
	renewed  time.Time // start of the claim, or of the last successful renewal
	stopped  bool      // the handler returned, or the lease was lost
	inflight sync.WaitGroup
}

// startLease starts renewing the lease that a claim begun at claimed took.
func (d *Idempotency) startLease(cancel context.CancelCauseFunc, key, token, scope string, claimed time.Time) *lease {
	l := &lease{d: d, cancel: cancel, key: key, token: token, scope: scope, renewed: claimed}
	l.mu.Lock()
	l.timer = time.AfterFunc(d.cfg.LeaseTTL/3, l.renew)
	l.mu.Unlock()
	return l
}

// renew runs on the timer: one renewal, then the next one is scheduled.
//
// Renewals do not run under the message's context: a subscriber that
// cancels it (NATS after AckWait, many on Close) must not stop the renewals
// of a handler that is still running, or its copy would run beside it. They
// stop when the handler returns, or when the lease is lost: the store says
// so, or renewals kept failing until the lease the store holds has surely
// expired. A failed renewal is retried after a tenth of the lease, and no
// call outlasts the lease, so the handler's context is cancelled before the
// store lets another consumer claim the key (see giveUp).
func (l *lease) renew() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	ttl := l.d.cfg.LeaseTTL
	left := time.Until(l.giveUp())
	if left <= 0 {
		l.lose(errors.New("no renewal succeeded within the lease"))
		l.mu.Unlock()
		return
	}
	l.inflight.Add(1)
	l.mu.Unlock()
	defer l.inflight.Done()

	d := l.d
	start := time.Now()
	rctx, rcancel := context.WithTimeout(context.Background(), min(d.cfg.StoreTimeout, ttl/3, left))
	err := d.cfg.Store.Renew(rctx, l.key, l.token, ttl)
	rcancel()
	d.observe(OpRenew, start, err)

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	next := ttl / 3
	switch {
	case err == nil:
		l.renewed = start
	case errors.Is(err, ErrLeaseLost):
		l.lose(err)
		return
	default:
		d.logInfo("Lease renewal failed; retrying", delivery{scope: l.scope, key: l.key}, watermill.LogFields{"err": err})
		next = max(min(ttl/10, time.Until(l.giveUp())), 0)
	}
	l.timer.Reset(next)
}

// lose ends the lease and cancels the handler's context with ErrLeaseLost
// as its cause. The caller holds l.mu.
func (l *lease) lose(err error) {
	l.stopped = true
	l.d.logError("Lease lost while the handler runs; cancelling its context", err, delivery{scope: l.scope, key: l.key})
	l.cancel(ErrLeaseLost)
}

// giveUp is when, with no renewal succeeding, the lease is declared lost:
// a tenth of the lease before the store expires it, so that the handler's
// context is cancelled before another consumer can claim the key. The
// caller holds l.mu.
func (l *lease) giveUp() time.Time {
	ttl := l.d.cfg.LeaseTTL
	return l.renewed.Add(ttl - ttl/10)
}

// expiry is when the store expires the lease if no renewal succeeds.
func (l *lease) expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(l.d.cfg.LeaseTTL)
}

// stop ends the renewals and waits for one in progress, which is bounded by
// the lease. It may be called more than once.
func (l *lease) stop() {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	l.mu.Unlock()
	l.inflight.Wait()
}
