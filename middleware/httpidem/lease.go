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

// leaseKeeper renews the owner's lease every lease/3 while the handler runs,
// and cancels the handler's context (cause: middleware.ErrLeaseLost) when the
// lease is lost.
type leaseKeeper struct {
	store  middleware.Store
	key    string
	token  string
	lease  time.Duration
	cancel context.CancelCauseFunc
	logger watermill.LoggerAdapter

	mu        sync.Mutex
	renewedAt time.Time // when the last successful Claim or Renew was sent

	done     chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once
}

func startLease(store middleware.Store, key, token string, lease time.Duration, claimedAt time.Time,
	cancel context.CancelCauseFunc, logger watermill.LoggerAdapter) *leaseKeeper {
	k := &leaseKeeper{
		store: store, key: key, token: token, lease: lease, cancel: cancel, logger: logger,
		renewedAt: claimedAt, done: make(chan struct{}), stopped: make(chan struct{}),
	}
	go k.loop()
	return k
}

func (k *leaseKeeper) loop() {
	defer close(k.stopped)
	t := time.NewTicker(k.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-k.done:
			return
		case <-t.C:
		}
		if !k.renew() {
			return
		}
	}
}

// renew extends the lease once; it returns false once the lease is lost.
func (k *leaseKeeper) renew() bool {
	sent := time.Now()
	if sent.After(k.expiry()) {
		k.lost(fmt.Errorf("httpidem: lease of %v not renewed in time: %w", k.lease, middleware.ErrLeaseLost))
		return false
	}
	ctx, cancel := context.WithDeadline(context.Background(), k.expiry())
	err := k.store.Renew(ctx, k.key, k.token, k.lease)
	cancel()
	switch {
	case err == nil:
		k.mu.Lock()
		k.renewedAt = sent
		k.mu.Unlock()
		return true
	case errors.Is(err, middleware.ErrLeaseLost):
		k.lost(err)
		return false
	default:
		// A store blip: the lease may still hold; the next tick tries again,
		// and a lease that ran out is reported lost then.
		k.logger.Error("Cannot renew lease", err, nil)
		return true
	}
}

func (k *leaseKeeper) lost(err error) {
	k.logger.Error("Lease lost while the handler runs; cancelling its context", err, nil)
	k.cancel(err)
}

// expiry is the earliest time the lease may end, by this host's clock.
func (k *leaseKeeper) expiry() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.renewedAt.Add(k.lease)
}

// stop ends the renewals and waits for the renewing goroutine to return.
func (k *leaseKeeper) stop() {
	k.stopOnce.Do(func() { close(k.done) })
	<-k.stopped
}
