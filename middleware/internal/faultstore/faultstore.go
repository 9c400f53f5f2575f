package faultstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// A Fault decides what one call of a Store does: it may pass the call on to
// the wrapped store (Call.Pass), before or after a wait of its own, or
// answer the caller itself. What it returns is the caller's error.
type Fault func(ctx context.Context, c Call) error

// Call is one call of a Store, as its Fault sees it.
type Call struct {
	// Op is the method called: "claim", "renew", "complete", "fail" or
	// "release", as the Observer names it.
	Op string
	// Key is the stored key the call is about.
	Key string
	// N counts the calls of Op on this Store: 1 for the first.
	N int64
	// pass makes the call on the wrapped store.
	pass func(ctx context.Context) error
}

// Pass makes the call on the wrapped store and returns its error.
func (c Call) Pass(ctx context.Context) error { return c.pass(ctx) }

// Store is an idempotency.Store that runs each call of an operation given
// a Fault (On) through it, and passes every other call on.
type Store struct {
	// Store is the wrapped store, behind the interface: Get and Delete, and
	// the operations without a Fault, go to it.
	idempotency.Store

	mu     sync.Mutex
	faults map[string]Fault
	calls  map[string]*atomic.Int64
}

var _ idempotency.Store = (*Store)(nil)

// New wraps inner; until On gives an operation a Fault, every call passes
// through.
func New(inner idempotency.Store) *Store {
	s := &Store{Store: inner, faults: map[string]Fault{}, calls: map[string]*atomic.Int64{}}
	for _, op := range []string{"claim", "renew", "complete", "fail", "release"} {
		s.calls[op] = &atomic.Int64{}
	}
	return s
}

// On makes f decide every later call of op (nil: pass them on), and
// returns s.
func (s *Store) On(op string, f Fault) *Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[op] = f
	return s
}

// Calls is how many calls of op the Store has had, passed on or not.
func (s *Store) Calls(op string) int64 { return s.calls[op].Load() }

// run counts the call and hands it to op's Fault, or passes it on.
func (s *Store) run(ctx context.Context, op string, key string, pass func(context.Context) error) error {
	n := s.calls[op].Add(1)
	s.mu.Lock()
	f := s.faults[op]
	s.mu.Unlock()
	if f == nil {
		return pass(ctx)
	}
	return f(ctx, Call{Op: op, Key: key, N: n, pass: pass})
}

// Claim runs through the "claim" Fault; when that fails the call, the
// result is zero.
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	var res idempotency.ClaimResult
	err := s.run(ctx, "claim", key, func(ctx context.Context) error {
		var err error
		res, err = s.Store.Claim(ctx, key, req)
		return err
	})
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	return res, nil
}

// Renew runs through the "renew" Fault.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	return s.run(ctx, "renew", key, func(ctx context.Context) error {
		return s.Store.Renew(ctx, key, token, lease)
	})
}

// Complete runs through the "complete" Fault.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.run(ctx, "complete", key, func(ctx context.Context) error {
		return s.Store.Complete(ctx, key, token, result, ttl)
	})
}

// Fail runs through the "fail" Fault.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.run(ctx, "fail", key, func(ctx context.Context) error {
		return s.Store.Fail(ctx, key, token, ttl)
	})
}

// Release runs through the "release" Fault.
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.run(ctx, "release", key, func(ctx context.Context) error {
		return s.Store.Release(ctx, key, token)
	})
}

// Pass passes the call on: a Fault for the calls that behave.
func Pass(ctx context.Context, c Call) error { return c.Pass(ctx) }

// Hang never answers: it waits until the caller's context ends and returns
// its error, as a call to a store behind a partition does. The wrapped
// store is not called.
func Hang(ctx context.Context, c Call) error {
	<-ctx.Done()
	return fmt.Errorf("faultstore: %s hangs: %w", c.Op, ctx.Err())
}

// Fail answers err at once without calling the wrapped store, as a refused
// connection does.
func Fail(err error) Fault {
	return func(context.Context, Call) error { return err }
}

// LoseReply makes the call and then answers err in place of the store's
// success, as when the reply is lost on its way back; a failed call keeps
// its own error.
func LoseReply(err error) Fault {
	return func(ctx context.Context, c Call) error {
		if perr := c.Pass(ctx); perr != nil {
			return perr
		}
		return err
	}
}

// Sleep waits d, whatever the caller's context, and then passes the call on:
// a store that answers late and a client that waits for it.
func Sleep(d time.Duration) Fault {
	return func(ctx context.Context, c Call) error {
		time.Sleep(d)
		return c.Pass(ctx)
	}
}

// Delay waits d before passing the call on, as a request slow to reach the
// store does; if the caller's context ends first, it returns its error and
// the store never sees the call.
func Delay(d time.Duration) Fault {
	return func(ctx context.Context, c Call) error {
		if err := wait(ctx, time.After(d)); err != nil {
			return err
		}
		return c.Pass(ctx)
	}
}

// SlowReply passes the call on at once and holds its answer d, as a reply
// slow to come back does; if the caller's context ends first, the caller
// gets its error although the store applied the call.
func SlowReply(d time.Duration) Fault {
	return func(ctx context.Context, c Call) error {
		if err := c.Pass(ctx); err != nil {
			return err
		}
		return wait(ctx, time.After(d))
	}
}

// Hold waits until release is closed and then lets then decide the call
// (nil: pass it on); if the caller's context ends first, it returns its
// error and the store never sees the call.
func Hold(release <-chan struct{}, then Fault) Fault {
	if then == nil {
		then = Pass
	}
	return func(ctx context.Context, c Call) error {
		if err := wait(ctx, release); err != nil {
			return err
		}
		return then(ctx, c)
	}
}

// First applies f to the first n calls of the operation and passes the
// later ones on.
func First(n int64, f Fault) Fault {
	return func(ctx context.Context, c Call) error {
		if c.N <= n {
			return f(ctx, c)
		}
		return c.Pass(ctx)
	}
}

// Sequence applies fs[0] to the first call of the operation, fs[1] to the
// second, and the last of fs to every call after.
func Sequence(fs ...Fault) Fault {
	return func(ctx context.Context, c Call) error {
		return fs[min(c.N, int64(len(fs)))-1](ctx, c)
	}
}

// wait returns nil once done is ready, or the context's error if it ends
// first.
func wait[T any](ctx context.Context, done <-chan T) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
