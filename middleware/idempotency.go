package middleware

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Idempotency is the Watermill middleware: add it with
// router.AddMiddleware(idem.Middleware), or to one handler with
// handler.AddMiddleware(idem.Middleware). It is safe for concurrent use by any
// number of handlers and routers.
type Idempotency struct {
	cfg    Config
	logger watermill.LoggerAdapter
	// inProcess: the store never waits on I/O, so calls need no timeout.
	inProcess bool
}

// New returns the middleware for cfg. It copies cfg, fills the defaults of
// its zero fields and validates it; a nil logger logs nothing.
func New(cfg Config, logger watermill.LoggerAdapter) (*Idempotency, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	_, inProcess := cfg.Store.(InProcessStore)
	return &Idempotency{cfg: cfg, logger: logger, inProcess: inProcess}, nil
}

// Config returns the configuration in force, defaults filled.
func (d *Idempotency) Config() Config { return d.cfg }

// Middleware wraps h so that each key's effect happens once. See the
// package documentation for what the router is returned in every case.
func (d *Idempotency) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return d.handle(msg, h)
	}
}

func (d *Idempotency) handle(msg *message.Message, h message.HandlerFunc) ([]*message.Message, error) {
	scope := d.cfg.Scope(msg)
	fields := watermill.LogFields{"message_uuid": msg.UUID, "handler_name": scope}
	key, err := d.StoreKey(msg)
	if err != nil {
		d.done(scope, OutcomeMissingKey, fields, err)
		return nil, err
	}
	fields["idempotency_key"] = key

	var fingerprint []byte
	if d.cfg.CheckPayload {
		sum := sha256.Sum256(msg.Payload)
		fingerprint = sum[:]
	}
	ctx := msg.Context()
	claim, err := d.claim(ctx, key, fingerprint)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		if d.cfg.FailOpen {
			d.done(scope, OutcomeFailOpen, fields, err)
			return h(msg)
		}
		err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		d.done(scope, OutcomeStoreUnavailable, fields, err)
		d.nackDelay(ctx)
		return nil, err
	}
	rec := claim.Record
	fields["attempts"] = rec.Attempts

	if !claim.Acquired {
		return d.refused(ctx, scope, fields, rec, fingerprint)
	}
	if d.cfg.MaxAttempts > 0 && rec.Attempts > d.cfg.MaxAttempts {
		// The claim counted one more attempt; hand the key back as FAILED
		// without running the handler.
		d.fail(key, claim.Token, fields)
		err := fmt.Errorf("%w: %d of at most %d for key %q", ErrTooManyAttempts, rec.Attempts-1, d.cfg.MaxAttempts, key)
		d.done(scope, OutcomeTooManyAttempts, fields, err)
		return nil, err
	}
	return d.run(msg, h, scope, key, claim.Token, fields)
}

// refused answers a claim that did not acquire the key.
func (d *Idempotency) refused(ctx context.Context, scope string, fields watermill.LogFields, rec Record, fingerprint []byte) ([]*message.Message, error) {
	if len(fingerprint) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fingerprint, rec.Fingerprint) {
		err := fmt.Errorf("%w: key %v", ErrKeyReused, fields["idempotency_key"])
		d.done(scope, OutcomeKeyReused, fields, err)
		return nil, err
	}
	switch rec.State {
	case StateCompleted:
		out, stored, err := decodeOutput(rec.Result)
		if err != nil {
			// The effect happened: ack, but say loudly that its output is lost.
			d.logger.Error("Stored output of a completed key is unreadable; acking without it", err, fields)
		} else if !stored {
			d.logger.Debug("Duplicate of a key completed without a stored output", fields)
		}
		d.done(scope, OutcomeDuplicate, fields, nil)
		return out, nil
	case StateInProgress:
		d.nackDelay(ctx)
		err := fmt.Errorf("%w: key %v", ErrInProgress, fields["idempotency_key"])
		d.done(scope, OutcomeInProgress, fields, err)
		return nil, err
	default:
		// A store must not refuse an ABSENT or FAILED key without a
		// fingerprint mismatch; treat it as busy so the message comes back.
		err := fmt.Errorf("%w: store refused a %s key", ErrInProgress, rec.State)
		d.done(scope, OutcomeInProgress, fields, err)
		return nil, err
	}
}

// nackDelay waits NackDelay, or until ctx ends, before a nack.
func (d *Idempotency) nackDelay(ctx context.Context) {
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

// run executes the handler under a renewed lease and records the result.
func (d *Idempotency) run(msg *message.Message, h message.HandlerFunc, scope, key, token string, fields watermill.LogFields) (out []*message.Message, err error) {
	parent := msg.Context()
	ctx, cancel := context.WithCancelCause(parent)
	lease := d.startLease(ctx, cancel, key, token, fields)
	msg.SetContext(ctx)

	finished := false
	defer func() {
		lease.stop()
		cancel(nil)
		msg.SetContext(parent)
		if !finished { // the handler panicked: let the next delivery retry
			d.fail(key, token, fields)
			d.done(scope, OutcomeHandlerFailed, fields, errors.New("handler panicked"))
		}
	}()
	out, err = h(msg)
	finished = true
	lease.stop()

	if err != nil {
		d.fail(key, token, fields)
		d.done(scope, OutcomeHandlerFailed, fields, err)
		return out, err
	}

	result := d.encodeResult(out, fields)
	switch cerr := d.complete(key, token, result, lease); {
	case cerr == nil:
		d.done(scope, OutcomeProcessed, fields, nil)
	case errors.Is(cerr, ErrLeaseLost):
		d.done(scope, OutcomeLeaseLost, fields, cerr)
	default:
		// Nacking now would run the effect again: ack, and say so.
		d.done(scope, OutcomeCompleteFailed, fields, cerr)
	}
	return out, nil
}

func (d *Idempotency) encodeResult(out []*message.Message, fields watermill.LogFields) []byte {
	if d.cfg.DisableOutputReplay {
		return []byte{outputOmitted}
	}
	if len(out) == 0 {
		return nil
	}
	b := encodeOutput(out)
	if len(b) > d.cfg.MaxOutputSize {
		d.logger.Info("Output larger than MaxOutputSize is not stored; duplicates will not republish it",
			fields.Add(watermill.LogFields{"output_bytes": len(b), "max_output_bytes": d.cfg.MaxOutputSize}))
		return []byte{outputOmitted}
	}
	return b
}

// storeCtx bounds one store call by StoreTimeout, unless the store is in
// process and cannot hang.
func (d *Idempotency) storeCtx(parent context.Context) (context.Context, context.CancelFunc) {
	if d.inProcess {
		return parent, func() {}
	}
	return context.WithTimeout(parent, d.cfg.StoreTimeout)
}

func (d *Idempotency) claim(ctx context.Context, key string, fingerprint []byte) (ClaimResult, error) {
	ctx, cancel := d.storeCtx(ctx)
	defer cancel()
	start := time.Now()
	res, err := d.cfg.Store.Claim(ctx, key, d.cfg.LeaseTTL, fingerprint)
	d.cfg.Observer.StoreLatency(OpClaim, time.Since(start), err)
	return res, err
}

// complete writes COMPLETED, retrying failures other than a lost lease until
// the lease would have expired.
func (d *Idempotency) complete(key, token string, result []byte, lease *lease) error {
	backoff := 20 * time.Millisecond
	for {
		ctx, cancel := d.storeCtx(context.Background())
		start := time.Now()
		err := d.cfg.Store.Complete(ctx, key, token, result, d.cfg.CompletedTTL)
		cancel()
		d.cfg.Observer.StoreLatency(OpComplete, time.Since(start), err)
		if err == nil || errors.Is(err, ErrLeaseLost) || time.Now().Add(backoff).After(lease.expiry()) {
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// fail records a failed attempt. Its error is only logged: if FAILED cannot
// be written, the lease expires and the key becomes claimable anyway.
func (d *Idempotency) fail(key, token string, fields watermill.LogFields) {
	ctx, cancel := d.storeCtx(context.Background())
	defer cancel()
	start := time.Now()
	err := d.cfg.Store.Fail(ctx, key, token, d.cfg.FailedTTL)
	d.cfg.Observer.StoreLatency(OpFail, time.Since(start), err)
	switch {
	case errors.Is(err, ErrLeaseLost):
		d.logger.Info("Failed attempt not recorded: the lease was already lost", fields)
	case err != nil:
		d.logger.Error("Could not record a failed attempt; the key is claimable once its lease expires", err, fields)
	}
}

// done logs and counts one delivery's outcome.
func (d *Idempotency) done(scope string, outcome Outcome, fields watermill.LogFields, err error) {
	d.cfg.Observer.Outcome(scope, outcome)
	// fields belongs to this delivery alone and nothing reads it any more
	// (the lease has stopped): extend it in place rather than copy it.
	fields["outcome"] = string(outcome)
	switch outcome {
	case OutcomeProcessed, OutcomeDuplicate, OutcomeInProgress:
		d.logger.Debug("Idempotency outcome", fields)
	case OutcomeHandlerFailed:
		fields["err"] = err
		d.logger.Info("Idempotency outcome", fields)
	default:
		d.logger.Error("Idempotency outcome", err, fields)
	}
}
