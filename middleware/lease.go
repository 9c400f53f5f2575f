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
type lease struct {
	ttl      time.Duration
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}

	mu      sync.Mutex
	renewed time.Time // start of the last successful claim or renewal
}

func (d *Idempotency) startLease(ctx context.Context, cancel context.CancelCauseFunc, key, token string, fields watermill.LogFields) *lease {
	l := &lease{ttl: d.cfg.LeaseTTL, quit: make(chan struct{}), done: make(chan struct{}), renewed: time.Now()}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(d.cfg.LeaseTTL / 3)
		defer tick.Stop()
		for {
			select {
			case <-l.quit:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			rctx, rcancel := context.WithTimeout(ctx, min(d.cfg.StoreTimeout, d.cfg.LeaseTTL/3))
			err := d.cfg.Store.Renew(rctx, key, token, d.cfg.LeaseTTL)
			rcancel()
			d.cfg.Observer.StoreLatency(OpRenew, time.Since(start), err)
			switch {
			case err == nil:
				l.mu.Lock()
				l.renewed = start
				l.mu.Unlock()
			case errors.Is(err, ErrLeaseLost) || time.Now().After(l.expiry()):
				d.logger.Error("Lease lost while the handler runs; cancelling its context", err, fields)
				cancel(ErrLeaseLost)
				return
			case ctx.Err() == nil:
				d.logger.Info("Lease renewal failed; retrying", fields.Add(watermill.LogFields{"err": err}))
			}
		}
	}()
	return l
}

// expiry is when the store expires the lease if no renewal succeeds.
func (l *lease) expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed.Add(l.ttl)
}

// stop ends the renewals and waits for the renewing goroutine.
func (l *lease) stop() {
	l.stopOnce.Do(func() { close(l.quit) })
	<-l.done
}
