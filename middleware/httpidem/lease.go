package httpidem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware"
)

// leaseKeeper renews the owner's lease while the handler runs: every lease/3
// after a renewal that succeeded, every lease/10 after one that failed, each
// call bounded by min(StoreTimeout, lease/3). It cancels the handler's
// context (cause: middleware.ErrLeaseLost) when the store reports the lease
// lost, and at the latest when the lease expires by this host's clock,
// counted from the start of the last successful claim or renewal: the store
// counts it from when the call reached it, which is no earlier, so the
// handler is stopped before another request can claim the key.
type leaseKeeper struct {
	store         middleware.Store
	key           string
	token         string
	lease         time.Duration
	timeout       time.Duration // of one renewal
	cancelHandler context.CancelCauseFunc
	logger        watermill.LoggerAdapter

	// ctx bounds the renewals; stop cancels it, so that a hanging store
	// call never holds the response.
	ctx          context.Context
	stopRenewals context.CancelFunc
	loopDone     chan struct{}

	mu        sync.Mutex
	renewedAt time.Time   // start of the last successful claim or renewal
	expired   *time.Timer // fires at renewedAt+lease
	stopped   bool
	lostLease bool
}

// startLease starts renewing a lease claimed by a call sent at claimedAt.
func startLease(parent context.Context, store middleware.Store, key, token string, lease, storeTimeout time.Duration,
	claimedAt time.Time, cancelHandler context.CancelCauseFunc, logger watermill.LoggerAdapter) *leaseKeeper {
	ctx, stopRenewals := context.WithCancel(context.WithoutCancel(parent))
	k := &leaseKeeper{
		store: store, key: key, token: token, lease: lease, timeout: min(storeTimeout, lease/3),
		cancelHandler: cancelHandler, logger: logger,
		ctx: ctx, stopRenewals: stopRenewals, loopDone: make(chan struct{}),
		renewedAt: claimedAt,
	}
	k.mu.Lock()
	k.expired = time.AfterFunc(time.Until(claimedAt.Add(lease)), k.onExpiry)
	k.mu.Unlock()
	go k.loop()
	return k
}

func (k *leaseKeeper) loop() {
	defer close(k.loopDone)
	t := time.NewTimer(k.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-t.C:
		}
		next, ok := k.renew()
		if !ok {
			return
		}
		t.Reset(next)
	}
}

// renew extends the lease once and returns when to try next; false once
// the renewals are over (the lease is lost, or stop was called).
func (k *leaseKeeper) renew() (time.Duration, bool) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(k.ctx, k.timeout)
	err := k.store.Renew(ctx, k.key, k.token, k.lease)
	cancel()
	switch {
	case err == nil:
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.lostLease {
			return 0, false
		}
		k.renewedAt = sent
		if !k.stopped {
			k.expired.Reset(time.Until(sent.Add(k.lease)))
		}
		return k.lease / 3, !k.stopped
	case k.ctx.Err() != nil:
		return 0, false // stopped: the outcome is being recorded
	case errors.Is(err, middleware.ErrLeaseLost):
		k.lose(err, false)
		return 0, false
	default:
		// A store blip: the lease still holds until it expires (onExpiry
		// stops the handler then); retry well before that.
		k.logger.Error("Cannot renew lease; retrying", err, nil)
		return k.lease / 10, true
	}
}

// onExpiry runs when the lease may have expired at the store.
func (k *leaseKeeper) onExpiry() {
	k.lose(fmt.Errorf("httpidem: lease of %v not renewed in time: %w", k.lease, middleware.ErrLeaseLost), true)
}

// lose cancels the handler's context and ends the renewals, unless the
// handler already returned, or, when onlyIfExpired, a renewal succeeded
// meanwhile (and re-armed the expiry timer).
func (k *leaseKeeper) lose(err error, onlyIfExpired bool) {
	k.mu.Lock()
	if k.stopped || k.lostLease || onlyIfExpired && time.Now().Before(k.renewedAt.Add(k.lease)) {
		k.mu.Unlock()
		return
	}
	k.lostLease = true
	k.expired.Stop()
	k.mu.Unlock()
	k.logger.Error("Lease lost while the handler runs; cancelling its context", err, nil)
	k.cancelHandler(err)
	k.stopRenewals()
}

// expiry is the earliest time the lease may end, by this host's clock.
func (k *leaseKeeper) expiry() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.renewedAt.Add(k.lease)
}

// stop ends the renewals: it cancels one in progress and waits for it to
// return, which a store honouring its context does at once. It may be
// called more than once.
func (k *leaseKeeper) stop() {
	k.mu.Lock()
	k.stopped = true
	k.expired.Stop()
	k.mu.Unlock()
	k.stopRenewals()
	<-k.loopDone
}
