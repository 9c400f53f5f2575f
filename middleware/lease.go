package middleware

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// lease renews one claim every LeaseTTL/3 while its handler runs. When the
// store answers ErrLeaseLost, or no renewal has succeeded for a whole lease
// (so the store has surely expired it), the handler's context is cancelled
// with ErrLeaseLost as its cause.
//
// Renewals run on a timer (time.AfterFunc), not on a goroutine of their own:
// most handlers finish long before LeaseTTL/3, and for them the lease costs
// one timer that never fires instead of a goroutine, a ticker and two
// channels per message.
type lease struct {
	d      *Idempotency
	ctx    context.Context
	cancel context.CancelCauseFunc
	key    string
	scope  string
	token  string
	timer  *time.Timer

	mu       sync.Mutex
	renewed  time.Time // start of the last successful claim or renewal
	stopped  bool
	inflight sync.WaitGroup // a renewal in progress; Add only under mu while !stopped
}

func (d *Idempotency) startLease(ctx context.Context, cancel context.CancelCauseFunc, key, token, scope string) *lease {
	l := &lease{d: d, ctx: ctx, cancel: cancel, key: key, token: token, scope: scope, renewed: time.Now()}
	l.timer = time.AfterFunc(d.cfg.LeaseTTL/3, l.renew)
	return l
}

// renew runs on the timer: one renewal, then the next one is scheduled
// unless the lease was stopped, lost or its context ended.
func (l *lease) renew() {
	l.mu.Lock()
	if l.stopped || l.ctx.Err() != nil {
		l.mu.Unlock()
		return
	}
	l.inflight.Add(1)
	l.mu.Unlock()
	defer l.inflight.Done()

	d := l.d
	start := time.Now()
	rctx, rcancel := context.WithTimeout(l.ctx, min(d.cfg.StoreTimeout, d.cfg.LeaseTTL/3))
	err := d.cfg.Store.Renew(rctx, l.key, l.token, d.cfg.LeaseTTL)
	rcancel()
	d.observe(OpRenew, start, err)
	switch {
	case err == nil:
		l.mu.Lock()
		l.renewed = start
		l.mu.Unlock()
	case errors.Is(err, ErrLeaseLost) || time.Now().After(l.expiry()):
		d.logError("Lease lost while the handler runs; cancelling its context", err, delivery{scope: l.scope, key: l.key})
		l.cancel(ErrLeaseLost)
		return
	case l.ctx.Err() == nil:
		d.logInfo("Lease renewal failed; retrying", delivery{scope: l.scope, key: l.key}, watermill.LogFields{"err": err})
	}
	l.mu.Lock()
	if !l.stopped && l.ctx.Err() == nil {
		l.timer.Reset(d.cfg.LeaseTTL / 3)
	}
	l.mu.Unlock()
}

// expiry is when the store expires the lease if no renewal succeeds.
func (l *lease) expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(l.d.cfg.LeaseTTL)
}

// stop ends the renewals and waits for one in progress. It may be called
// more than once.
func (l *lease) stop() {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	l.mu.Unlock()
	l.inflight.Wait()
}
