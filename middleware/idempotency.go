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
	// quiet: the logger discards everything, so no log fields are built.
	quiet bool
	// timed: the observer wants store latencies, so calls are timed.
	timed bool
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
	_, quiet := logger.(watermill.NopLogger)
	_, untimed := cfg.Observer.(nopObserver)
	return &Idempotency{cfg: cfg, logger: logger, inProcess: inProcess, quiet: quiet, timed: !untimed}, nil
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
	dv := delivery{uuid: msg.UUID, scope: scope}
	key, err := d.storeKey(msg, scope)
	if err != nil {
		d.done(OutcomeMissingKey, dv, err)
		return nil, err
	}
	dv.key = key

	var fingerprint []byte
	if d.cfg.CheckPayload {
		sum := sha256.Sum256(msg.Payload)
		fingerprint = sum[:]
	}
	ctx := msg.Context()
	claimed := time.Now() // the lease counts from before the claim's round trip
	claim, err := d.claim(ctx, key, fingerprint)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		if d.cfg.FailOpen {
			d.done(OutcomeFailOpen, dv, err)
			return h(msg)
		}
		err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		d.done(OutcomeStoreUnavailable, dv, err)
		d.nackDelay(ctx)
		return nil, err
	}
	rec := claim.Record
	dv.attempts = rec.Attempts

	if !claim.Acquired {
		return d.refused(ctx, dv, rec, fingerprint)
	}
	if d.cfg.MaxAttempts > 0 && rec.Attempts > d.cfg.MaxAttempts {
		// The claim counted one more attempt; hand the key back as FAILED
		// without running the handler.
		d.fail(key, claim.Token, dv)
		err := fmt.Errorf("%w: %d of at most %d for key %q", ErrTooManyAttempts, rec.Attempts-1, d.cfg.MaxAttempts, key)
		d.done(OutcomeTooManyAttempts, dv, err)
		return nil, err
	}
	return d.run(msg, h, key, claim.Token, claimed, dv)
}

// refused answers a claim that did not acquire the key.
func (d *Idempotency) refused(ctx context.Context, dv delivery, rec Record, fingerprint []byte) ([]*message.Message, error) {
	// A different payload under a key whose first run is still going is
	// nacked like any copy of it: the reuse is decided once that run ends.
	if rec.State != StateInProgress && len(fingerprint) > 0 && len(rec.Fingerprint) > 0 && !bytes.Equal(fingerprint, rec.Fingerprint) {
		err := fmt.Errorf("%w: key %v", ErrKeyReused, dv.key)
		d.done(OutcomeKeyReused, dv, err)
		return nil, err
	}
	switch rec.State {
	case StateCompleted:
		out, stored, err := decodeOutput(rec.Result)
		if err != nil {
			// The effect happened: ack, but say loudly that its output is lost.
			d.logError("Stored output of a completed key is unreadable; acking without it", err, dv)
		} else if !stored {
			d.logDebug("Duplicate of a key completed without a stored output", dv)
		}
		d.done(OutcomeDuplicate, dv, nil)
		return out, nil
	case StateInProgress:
		d.nackDelay(ctx)
		err := fmt.Errorf("%w: key %v", ErrInProgress, dv.key)
		d.done(OutcomeInProgress, dv, err)
		return nil, err
	default:
		// A store must not refuse an ABSENT or FAILED key without a
		// fingerprint mismatch; treat it as busy so the message comes back.
		d.nackDelay(ctx)
		err := fmt.Errorf("%w: store refused a %s key", ErrInProgress, rec.State)
		d.done(OutcomeInProgress, dv, err)
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
func (d *Idempotency) run(msg *message.Message, h message.HandlerFunc, key, token string, claimed time.Time, dv delivery) (out []*message.Message, err error) {
	parent := msg.Context()
	ctx, cancel := context.WithCancelCause(parent)
	lease := d.startLease(cancel, key, token, dv.scope, claimed)
	msg.SetContext(ctx)

	finished := false
	defer func() {
		lease.stop()
		cancel(nil)
		msg.SetContext(parent)
		if !finished { // the handler panicked: let the next delivery retry
			d.fail(key, token, dv)
			d.done(OutcomeHandlerFailed, dv, errors.New("handler panicked"))
		}
	}()
	out, err = h(msg)
	finished = true
	lease.stop()

	if err != nil {
		d.fail(key, token, dv)
		d.done(OutcomeHandlerFailed, dv, err)
		return out, err
	}

	result := d.encodeResult(out, dv)
	switch cerr := d.complete(key, token, result, lease); {
	case cerr == nil:
		d.done(OutcomeProcessed, dv, nil)
	case errors.Is(cerr, ErrLeaseLost):
		d.done(OutcomeLeaseLost, dv, cerr)
	default:
		// Nacking now would run the effect again: ack, and say so.
		d.done(OutcomeCompleteFailed, dv, cerr)
	}
	return out, nil
}

func (d *Idempotency) encodeResult(out []*message.Message, dv delivery) []byte {
	if d.cfg.DisableOutputReplay {
		return []byte{outputOmitted}
	}
	if len(out) == 0 {
		return nil
	}
	b := encodeOutput(out)
	if len(b) > d.cfg.MaxOutputSize {
		d.logInfo("Output larger than MaxOutputSize is not stored; duplicates will not republish it", dv,
			watermill.LogFields{"output_bytes": len(b), "max_output_bytes": d.cfg.MaxOutputSize})
		return []byte{outputOmitted}
	}
	return b
}

// startTimer returns the start of a store call to observe, or the zero
// time when nobody observes (saving a clock read per call).
func (d *Idempotency) startTimer() time.Time {
	if d.timed {
		return time.Now()
	}
	return time.Time{}
}

// observe reports a store call that began at start, if anyone listens.
func (d *Idempotency) observe(op string, start time.Time, err error) {
	if d.timed {
		d.cfg.Observer.StoreLatency(op, time.Since(start), err)
	}
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
	start := d.startTimer()
	res, err := d.cfg.Store.Claim(ctx, key, d.cfg.LeaseTTL, fingerprint)
	d.observe(OpClaim, start, err)
	return res, err
}

// complete writes COMPLETED, retrying failures other than a lost lease until
// the lease would have expired.
func (d *Idempotency) complete(key, token string, result []byte, lease *lease) error {
	backoff := 20 * time.Millisecond
	retried := false
	for {
		ctx, cancel := d.storeCtx(context.Background())
		start := d.startTimer()
		err := d.cfg.Store.Complete(ctx, key, token, result, d.cfg.CompletedTTL)
		cancel()
		d.observe(OpComplete, start, err)
		if errors.Is(err, ErrLeaseLost) && retried && time.Now().Before(lease.expiry()) {
			// An earlier try may have been applied with its reply lost; within
			// our lease nobody else can have completed the key.
			if rec, gerr := d.get(key); gerr == nil && rec.State == StateCompleted {
				return nil
			}
		}
		if err == nil || errors.Is(err, ErrLeaseLost) || time.Now().Add(backoff).After(lease.expiry()) {
			return err
		}
		retried = true
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

func (d *Idempotency) get(key string) (Record, error) {
	ctx, cancel := d.storeCtx(context.Background())
	defer cancel()
	return d.cfg.Store.Get(ctx, key)
}

// fail records a failed attempt. Its error is only logged: if FAILED cannot
// be written, the lease expires and the key becomes claimable anyway.
func (d *Idempotency) fail(key, token string, dv delivery) {
	ctx, cancel := d.storeCtx(context.Background())
	defer cancel()
	start := d.startTimer()
	err := d.cfg.Store.Fail(ctx, key, token, d.cfg.FailedTTL)
	d.observe(OpFail, start, err)
	switch {
	case errors.Is(err, ErrLeaseLost):
		d.logInfo("Failed attempt not recorded: the lease was already lost", dv, nil)
	case err != nil:
		d.logError("Could not record a failed attempt; the key is claimable once its lease expires", err, dv)
	}
}

// done logs and counts one delivery's outcome.
func (d *Idempotency) done(outcome Outcome, dv delivery, err error) {
	d.cfg.Observer.Outcome(dv.scope, outcome)
	if d.quiet {
		return
	}
	fields := dv.fields()
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

// delivery is what the logs say about one delivery. Its fields are built
// only when something is logged: the hot path of a quiet middleware
// allocates no map.
type delivery struct {
	uuid, scope, key string
	attempts         int
}

func (dv delivery) fields() watermill.LogFields {
	f := watermill.LogFields{"message_uuid": dv.uuid, "handler_name": dv.scope}
	if dv.key != "" {
		f["idempotency_key"] = dv.key
	}
	if dv.attempts > 0 {
		f["attempts"] = dv.attempts
	}
	return f
}

func (d *Idempotency) logDebug(msg string, dv delivery) {
	if !d.quiet {
		d.logger.Debug(msg, dv.fields())
	}
}

func (d *Idempotency) logInfo(msg string, dv delivery, extra watermill.LogFields) {
	if !d.quiet {
		d.logger.Info(msg, dv.fields().Add(extra))
	}
}

func (d *Idempotency) logError(msg string, err error, dv delivery) {
	if !d.quiet {
		d.logger.Error(msg, err, dv.fields())
	}
}
