package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// Middleware is the Watermill middleware: add it with
// router.AddMiddleware(mw.Middleware), or to one handler. It is safe for
// concurrent use by any number of handlers and routers.
type Middleware struct {
	cfg  Config
	once *Once
}

// New returns the middleware that runs each handler under once, with what
// cfg adds. A nil cfg means the defaults. Problems of cfg match
// [ErrInvalidConfig].
func New(once *Once, cfg *Config) (*Middleware, error) {
	problems := configerr.New(ErrInvalidConfig)
	if once == nil {
		problems.Addf("Once is required")
	}
	var c Config
	if cfg != nil {
		c = *cfg
		configerr.KeyPrefix(problems, c.KeyPrefix)
	}
	if err := problems.Err(); err != nil {
		return nil, err
	}
	c.setDefaults()
	if err := once.usePrefix(c.KeyPrefix, false); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Middleware{cfg: c, once: once}, nil
}

// Middleware wraps h so that each key's effect happens once. See the
// package documentation for what the router is returned in every case.
func (d *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return d.handle(msg, h)
	}
}

func (d *Middleware) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	scope := d.cfg.Scope(msg)
	dv := delivery{uuid: msg.UUID, scope: scope, ctx: msg.Context()}
	key, err := d.storeKey(msg, scope)
	if err != nil {
		d.once.done(OutcomeMissingKey, dv, err)
		return nil, err
	}
	dv.key = key

	var fingerprint []byte
	if d.cfg.CheckPayload {
		sum := sha256.Sum256(msg.Payload)
		fingerprint = sum[:]
	}
	ctx := msg.Context()
	// A cached record is only read: decodeOutput copies what it returns.
	lease, claim, _, err := d.once.claim(ctx, key, fingerprint, requeuedSpent(msg), dv)
	dv.attempts = claim.Record.Attempts
	switch {
	case err == nil && lease != nil:
		return d.run(msg, h, lease, dv)
	case err == nil:
		return d.refused(ctx, dv, claim.Record, fingerprint)
	case errors.Is(err, ErrStoreUnavailable) && ctx.Err() != nil:
		return nil, err // the subscriber is closing: just nack
	case errors.Is(err, ErrStoreUnavailable) && d.once.cfg.FailOpen:
		d.once.done(OutcomeFailOpen, dv, err)
		return h(msg)
	}
	d.once.done(OutcomeOf(err), dv, err)
	if errors.Is(err, ErrTooManyAttempts) {
		// The count goes out with the message: a copy requeued from the
		// poison queue counts its budget from there. The handler's mark
		// goes: the poison queue sets it again on what it publishes, and
		// a Retry between the two, handing this message back, must not
		// pass for a requeue.
		if msg.Metadata == nil {
			msg.Metadata = message.Metadata{}
		}
		msg.Metadata.Set(attemptsPoisonedKey, strconv.Itoa(claim.Record.Attempts))
		delete(msg.Metadata, poisonedHandlerKey)
	}
	if !IsPermanent(err) {
		d.nackDelay(ctx)
	}
	return nil, err
}

// The metadata by which a message requeued from a poison queue is known.
const (
	// attemptsPoisonedKey is set, on a message refused with
	// ErrTooManyAttempts, to its key's attempt count, before a poison
	// queue outside publishes it.
	attemptsPoisonedKey = "idempotency_attempts_poisoned"
	// poisonedHandlerKey is Watermill's middleware.PoisonedHandlerKey: the
	// handler whose poison queue published the message. (The core does not
	// import Watermill's middleware package, nor what it links.)
	poisonedHandlerKey = "handler_poisoned"
)

// requeuedSpent returns the attempts of msg's key that the budgets before
// this copy's used up: the count the middleware put on msg when it refused
// it for MaxAttempts, when msg came back from this handler's poison queue
// (Watermill's PoisonedHandlerKey names this handler), else 0. Every copy
// of one requeue carries the same count, so they share one budget; a copy
// refused again carries the new count out, to the poison queue. Once.claim
// ignores a count above the record's.
func requeuedSpent(msg *message.Message) int {
	handler, ok := msg.Metadata[poisonedHandlerKey]
	if !ok || handler != message.HandlerNameFromCtx(msg.Context()) {
		return 0
	}
	n, err := strconv.Atoi(msg.Metadata.Get(attemptsPoisonedKey))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// refused answers a claim that did not acquire the key.
func (d *Middleware) refused(ctx context.Context, dv delivery, rec Record, fingerprint []byte) ([]*message.Message, error) {
	// A different payload under a key whose first run is still going is
	// nacked like any copy of it: the reuse is decided once that run ends.
	if rec.State != StateInProgress && len(fingerprint) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fingerprint, rec.Fingerprint) {
		err := fmt.Errorf("%w: key %v", ErrKeyReused, dv.key)
		d.once.done(OutcomeKeyReused, dv, err)
		return nil, err
	}
	switch rec.State {
	case StateCompleted:
		out, stored, err := storekit.DecodeOutput(rec.Result)
		if err != nil {
			// The effect happened: ack, but say loudly that its output is lost.
			d.once.logError("Stored output of a completed key is unreadable; acking without it", err, dv)
		} else if !stored {
			d.once.logDebug("Duplicate of a key completed without a stored output", dv)
		}
		d.once.done(OutcomeDuplicate, dv, nil)
		return out, nil
	case StateInProgress:
		d.nackDelay(ctx)
		err := fmt.Errorf("%w: key %v", ErrInProgress, dv.key)
		d.once.done(OutcomeInProgress, dv, err)
		return nil, err
	default:
		// A store must not refuse an ABSENT or FAILED key without a
		// fingerprint mismatch; treat it as busy so the message comes back.
		d.nackDelay(ctx)
		err := fmt.Errorf("%w: store refused a %s key", ErrInProgress, rec.State)
		d.once.done(OutcomeInProgress, dv, err)
		return nil, err
	}
}

// nackDelay waits NackDelay, or until ctx ends, before a nack.
func (d *Middleware) nackDelay(ctx context.Context) {
	if d.cfg.NackDelay <= 0 {
		return
	}
	t := time.NewTimer(d.cfg.NackDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// run executes the handler under the lease and records the result.
func (d *Middleware) run(msg *message.Message, h message.HandlerFunc, lease *Lease, dv delivery) (out []*message.Message, err error) {
	parent := msg.Context()
	lease.idem = d
	msg.SetContext(lease.Context())
	finished := false
	defer func() {
		msg.SetContext(parent)
		if !finished { // the handler panicked: let the next delivery retry
			lease.Fail()
			d.once.done(OutcomeHandlerFailed, dv, errors.New("handler panicked"))
		}
	}()
	out, err = h(msg)
	finished = true
	if err != nil {
		lease.Fail()
		d.once.done(OutcomeHandlerFailed, dv, err)
		return out, err
	}
	// Nacking after a failed Complete would run the effect again: ack, and
	// the outcome says so.
	result, tooLarge := d.encodeResult(out)
	cerr := lease.Complete(result)
	if cerr == nil && tooLarge > 0 {
		// COMPLETED holds no output: the router's publish of out is its only
		// one. Counted apart from processed, since a failed publish loses it.
		d.once.done(OutcomeOutputNotStored, dv, fmt.Errorf("%w: %d bytes of output, MaxOutputSize is %d", errOutputNotStored, tooLarge, d.once.cfg.MaxOutputSize))
		return out, nil
	}
	d.once.done(OutcomeOf(cerr), dv, cerr)
	return out, nil
}

// encodeResult returns what COMPLETED stores for out: its encoding, or the
// mark of an output not stored, when output replay is disabled or when the
// encoding is larger than MaxOutputSize; tooLarge is then that size (else
// 0).
func (d *Middleware) encodeResult(out []*message.Message) (result []byte, tooLarge int) {
	if d.cfg.DisableOutputReplay {
		return []byte{storekit.OutputOmitted}, 0
	}
	if len(out) == 0 {
		return nil, 0
	}
	b := storekit.EncodeOutput(out)
	if len(b) > d.once.cfg.MaxOutputSize {
		return []byte{storekit.OutputOmitted}, len(b)
	}
	return b, 0
}
