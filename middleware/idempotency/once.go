package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/internal/callergone"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
)

// defaultOnceName labels the outcomes of Once.Do when OnceConfig.Name is
// empty.
const defaultOnceName = "once"

// OnceConfig configures a Once. A zero field means its documented default;
// only Store is required. LeaseTTL and the TTLs are at most MaxTTL.
type OnceConfig struct {
	// Store keeps the state of every key. Required.
	Store Store
	// LeaseTTL is how long a claim holds a key without renewal; the owner
	// renews it every LeaseTTL/3 while its work runs. Zero means
	// DefaultLeaseTTL (40 s).
	LeaseTTL time.Duration
	// CompletedTTL is how long a completed key and its result are kept.
	// Zero means DefaultCompletedTTL (24 h).
	CompletedTTL time.Duration
	// FailedTTL is how long a failed key, or one whose lease lapsed, keeps
	// its attempt count. Zero means DefaultFailedTTL (24 h).
	FailedTTL time.Duration
	// StoreTimeout bounds each store call; an owner's calls are bounded by
	// what is left of its lease as well. Zero means DefaultStoreTimeout
	// (5 s).
	StoreTimeout time.Duration
	// MaxAttempts is how many times the work may run for one key; a claim
	// beyond that is ErrTooManyAttempts and runs nothing. Zero means
	// unlimited.
	MaxAttempts int
	// CacheTTL is how long, at most, a key this process saw COMPLETED (it
	// completed the key itself, or a claim found it completed) is answered
	// from memory, without a store call: a later claim of it comes back
	// refused with the cached record, as from the store. An entry never
	// outlives the record: it ends CompletedTTL after this process sent its
	// Complete, or CompletedTTL (less a second for clock skew) after the
	// record's UpdatedAt for a record read from a claim. That assumes every
	// process sharing the store completes keys with the same CompletedTTL,
	// and that their clocks and the store's agree within a second.
	// COMPLETED is terminal until it expires, with one exception: a Delete
	// by an operator (Store.Delete, idemctl) reaches a process that cached
	// the key only when its entry ends, so for up to CacheTTL that process
	// still answers the key as completed while the others run it again.
	// Zero means DefaultCacheTTL (1 min).
	CacheTTL time.Duration
	// CacheMaxBytes bounds the cache's memory: each entry counts its key,
	// result and fingerprint bytes and a fixed overhead; the least recently
	// used entries are evicted beyond it. The cache is split in up to 32
	// shards of at least 64 KiB each (32 from 2 MiB up), each with its own
	// bound; an entry larger than a shard's share is not cached. Zero means
	// DefaultCacheMaxBytes (16 MiB).
	CacheMaxBytes int
	// DisableCache turns the cache off: every claim goes to the store, and
	// an operator's Delete is seen at once. An in-process store (memstore)
	// is never cached, whatever this says: it answers from memory already.
	DisableCache bool
	// Name labels the outcomes of Do for the Observer, and the cache
	// lookups of Do and Claim for a CacheObserver. Empty means "once".
	Name string
	// Observer receives outcomes and store latencies. Nil means none.
	Observer Observer
}

func (c *OnceConfig) setDefaults() {
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.CompletedTTL = cmp.Or(c.CompletedTTL, DefaultCompletedTTL)
	c.FailedTTL = cmp.Or(c.FailedTTL, DefaultFailedTTL)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.CacheTTL = cmp.Or(c.CacheTTL, DefaultCacheTTL)
	c.CacheMaxBytes = cmp.Or(c.CacheMaxBytes, DefaultCacheMaxBytes)
	c.Name = cmp.Or(c.Name, defaultOnceName)
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
}

// Validate reports every problem of c, joined in the order of its fields;
// each matches ErrInvalidConfig. NewOnce calls it. A zero field is valid
// (it means its default), so a program may also call it on a config as
// written, to report every problem at start-up beside its other settings.
func (c OnceConfig) Validate() error {
	problems := configerr.New(ErrInvalidConfig)
	c.check(problems)
	return problems.Err()
}

// check adds what is wrong with c to problems, in the order of its fields.
func (c OnceConfig) check(problems *configerr.List) {
	if c.Store == nil {
		problems.Addf("Store is required")
	}
	configerr.TTL(problems, "LeaseTTL", c.LeaseTTL)
	configerr.TTL(problems, "CompletedTTL", c.CompletedTTL)
	configerr.TTL(problems, "FailedTTL", c.FailedTTL)
	configerr.NotNegative(problems, "StoreTimeout", c.StoreTimeout)
	configerr.Renewable(problems, c.LeaseTTL)
	if c.MaxAttempts < 0 {
		problems.Addf("MaxAttempts is %d, must be 0 (unlimited) or more", c.MaxAttempts)
	}
	configerr.TTL(problems, "CacheTTL", c.CacheTTL)
	configerr.NotNegative(problems, "CacheMaxBytes", c.CacheMaxBytes)
}

// Once is the owner's side of the protocol, written once for every adapter:
// the Watermill middleware, package httpidem and any Go code that calls Do.
// It claims a key, renews the lease while the work runs (cancelling the
// work's context before the store can hand the key to someone else),
// completes with retries and fails. It is safe for concurrent use.
type Once struct {
	cfg    OnceConfig
	logger watermill.LoggerAdapter
	// inProcess: the store never waits on I/O, so calls need no timeout.
	inProcess bool
	// quiet: the logger discards everything, so no log fields are built.
	quiet bool
	// timed: the observer wants store latencies, so calls are timed.
	timed bool
	// detailed: the observer is a ContextObserver.
	detailed bool
	// cache holds the COMPLETED records this process saw; nil when off.
	cache *completedCache
	// cacheObserver is the observer as a CacheObserver, or nil.
	cacheObserver CacheObserver
}

// NewOnce returns the protocol for cfg. It copies cfg, fills the defaults
// of its zero fields and validates it; a nil logger logs nothing.
func NewOnce(cfg OnceConfig, logger watermill.LoggerAdapter) (*Once, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	inProcess := inprocess.Is(cfg.Store)
	_, quiet := logger.(watermill.NopLogger)
	_, untimed := cfg.Observer.(nopObserver)
	_, detailed := cfg.Observer.(ContextObserver)
	o := &Once{cfg: cfg, logger: logger, inProcess: inProcess, quiet: quiet, timed: !untimed, detailed: detailed}
	// An in-process store answers from memory already: a cache would only
	// hold a second copy of its records.
	if !cfg.DisableCache && !inProcess {
		o.cache = newCompletedCache(cfg.CacheTTL, cfg.CacheMaxBytes)
		o.cacheObserver, _ = cfg.Observer.(CacheObserver)
	}
	return o, nil
}

// Result is what Do returns for a key.
type Result struct {
	// Value is what the work returned, or, when Replayed, what its first
	// successful run returned and the store kept.
	Value []byte
	// Replayed is true when the key was already COMPLETED and the work did
	// not run.
	Replayed bool
	// Attempts counts the runs of the work for this key, this one included.
	Attempts int
	// Outcome says what happened: OutcomeProcessed, OutcomeDuplicate, or,
	// after a run whose result could not be recorded, OutcomeCompleteFailed
	// or OutcomeLeaseLost (Value is then the run's, and a later call may run
	// the work again).
	Outcome Outcome
}

// Do runs work once per key across every process sharing the store, and
// returns its value to every later caller while the key is COMPLETED
// (CompletedTTL), with Replayed set. The work's context is cancelled, with
// ErrLeaseLost as its cause, if the lease is lost while it runs.
//
// Do returns:
//   - the work's error when it fails: the key is FAILED and a later Do runs
//     the work again; a panic fails the key too and goes on;
//   - ErrInProgress when another caller holds the key; try again later;
//   - ErrStoreUnavailable when the store cannot be reached; nothing ran;
//   - ErrCorruptRecord when the value under the key is not a record;
//   - ErrTooManyAttempts when the work already ran MaxAttempts times.
//
// A key this process saw COMPLETED is answered from memory for up to
// CacheTTL, without a store call (see OnceConfig.CacheTTL); Value is then a
// copy of the cached value.
//
// The key is used as given: put a prefix of your own in it when the store
// is shared.
func (o *Once) Do(ctx context.Context, key string, work func(ctx context.Context) ([]byte, error)) (Result, error) {
	dv := delivery{scope: o.cfg.Name, key: key, ctx: ctx}
	lease, claim, cached, err := o.claim(ctx, key, nil, 0, dv)
	dv.attempts = claim.Record.Attempts
	if err != nil {
		outcome := claimOutcome(err)
		if outcome == OutcomeStoreUnavailable && errors.Is(err, callergone.Err) {
			outcome = OutcomeCallerGone // no sign of the store
		}
		o.done(outcome, dv, err)
		return Result{Attempts: claim.Record.Attempts}, err
	}
	if lease == nil {
		if claim.Record.State == StateCompleted {
			o.done(OutcomeDuplicate, dv, nil)
			if cached {
				claim.Record.Result = cloneBytes(claim.Record.Result)
			}
			return Result{Value: claim.Record.Result, Replayed: true, Attempts: claim.Record.Attempts, Outcome: OutcomeDuplicate}, nil
		}
		err := fmt.Errorf("%w: key %q", ErrInProgress, key)
		o.done(OutcomeInProgress, dv, err)
		return Result{Attempts: claim.Record.Attempts}, err
	}

	lease.run.do = true // for RunFromContext
	finished := false
	defer func() {
		if !finished {
			lease.Fail()
			o.done(OutcomeHandlerFailed, dv, errors.New("work panicked"))
		}
	}()
	value, err := work(lease.Context())
	finished = true
	res := Result{Value: value, Attempts: claim.Record.Attempts}
	if err != nil {
		lease.Fail()
		o.done(OutcomeHandlerFailed, dv, err)
		return res, err
	}
	cerr := lease.Complete(value)
	res.Outcome = CompleteOutcome(cerr)
	o.done(res.Outcome, dv, cerr)
	return res, nil
}

// ClaimOptions are the optional parts of Once.Claim.
type ClaimOptions struct {
	// Fingerprint is stored with a new record; a claim whose fingerprint
	// differs from the stored one never acquires (see Store.Claim).
	Fingerprint []byte
	// LogFields are added to the lease's log lines.
	LogFields watermill.LogFields
}

// Claim claims key for a run whose result the caller writes itself; it is
// for adapters whose work is not a function returning bytes (package
// httpidem stores the response a handler wrote, grpcidem the answer of a
// call). Other code calls Do. It returns, exactly one of:
//   - a Lease when the caller now owns the key: run the work under
//     Lease.Context, then call Lease.Complete or Lease.Fail;
//   - no Lease and no error when the claim was refused: ClaimResult.Record
//     says why (COMPLETED with its result, IN_PROGRESS elsewhere, or a
//     different fingerprint); a key this process saw COMPLETED is answered
//     from the cache (OnceConfig.CacheTTL) without a store call, with a
//     copy of the record the store returned or this process completed;
//   - an error: ErrStoreUnavailable (wrapping the store's error; nothing was
//     claimed, or the claim was released again — also when a network
//     store answered only after nine tenths of the lease, too late for the
//     owner to keep it), ErrCorruptRecord,
//     ErrMissingKey for an empty key, or ErrTooManyAttempts (the key was
//     claimed beyond MaxAttempts and handed back as FAILED at once).
//
// ctx bounds the claim, with StoreTimeout, and is the parent of the lease's
// context.
func (o *Once) Claim(ctx context.Context, key string, opts ClaimOptions) (*Lease, ClaimResult, error) {
	lease, res, cached, err := o.claim(ctx, key, opts.Fingerprint, 0, delivery{key: key, extra: opts.LogFields})
	if cached {
		res.Record = cloneRecord(res.Record)
	}
	return lease, res, err
}

// claim is Claim for every adapter. cached says that the result is a
// COMPLETED record from the cache, whose slices the caller must not change
// (Claim and Do copy them, the middleware only decodes them). spent is how
// many of the key's attempts earlier budgets used up (a requeued poisoned
// message's, see requeuedSpent): MaxAttempts counts from there. A spent
// count the record has not reached is not the record's (it expired since,
// or the count was made up) and counts as 0.
func (o *Once) claim(ctx context.Context, key string, fingerprint []byte, spent int, dv delivery) (_ *Lease, _ ClaimResult, cached bool, _ error) {
	if key == "" {
		return nil, ClaimResult{}, false, fmt.Errorf("%w: %w", ErrMissingKey, ErrEmptyKey)
	}
	if rec, ok := o.cacheLookup(key, dv.scope); ok {
		return nil, ClaimResult{Record: rec}, true, nil
	}
	req := ClaimRequest{Token: NewToken(), Lease: o.cfg.LeaseTTL, TTL: o.cfg.FailedTTL, Fingerprint: fingerprint}
	claimed := time.Now() // the lease counts from before the claim's round trip
	cctx, cancel := o.storeCtx(ctx, o.cfg.StoreTimeout)
	start := o.startTimer()
	res, err := o.cfg.Store.Claim(cctx, key, req)
	gone := ctx.Err() != nil // judged before the release below waits on the store
	cancel()
	o.observe(OpClaim, start, err)
	switch {
	case errors.Is(err, ErrCorruptRecord):
		return nil, res, false, err
	case err != nil:
		// A claim sent over a network may have been applied with its reply
		// lost (or the call given up on): undo it, or the key would stall
		// until the lease lapses and count an attempt that never ran. An
		// in-process store applied nothing.
		if !o.inProcess {
			o.release(key, req.Token, dv)
		}
		if gone {
			return nil, res, false, fmt.Errorf("%w: %w: %w", ErrStoreUnavailable, callergone.Err, err)
		}
		return nil, res, false, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	case !res.Acquired:
		o.cacheClaimed(key, res.Record)
		return nil, res, false, nil
	case !o.inProcess && time.Since(claimed) >= o.cfg.LeaseTTL-o.cfg.LeaseTTL/10:
		// The answer came so late that the lease is about to lapse: running
		// the work now could overlap with the next owner. Give the key back.
		o.release(key, req.Token, dv)
		return nil, ClaimResult{}, false, fmt.Errorf("%w: the claim of %q took %v, most of the %v lease", ErrStoreUnavailable, key,
			time.Since(claimed).Round(time.Millisecond), o.cfg.LeaseTTL)
	}
	dv.attempts = res.Record.Attempts
	l := o.newLease(ctx, key, req.Token, claimed, dv)
	l.record = leaseRecord{attempts: res.Record.Attempts, fingerprint: res.Record.Fingerprint,
		created: res.Record.CreatedAt, updated: res.Record.UpdatedAt, leaseExpiration: res.Record.LeaseExpiresAt}
	if spent >= res.Record.Attempts {
		spent = 0
	}
	if o.cfg.MaxAttempts > 0 && res.Record.Attempts-spent > o.cfg.MaxAttempts {
		// The claim counted one more attempt; hand the key back as FAILED
		// without running anything.
		l.Fail()
		return nil, res, false, fmt.Errorf("%w: %d of at most %d for key %q", ErrTooManyAttempts, res.Record.Attempts-1-spent, o.cfg.MaxAttempts, key)
	}
	if spent > 0 && res.Record.Attempts-spent == 1 {
		o.logInfo("A requeued poisoned message starts a new budget of MaxAttempts", l.dv, watermill.LogFields{"attempts_poisoned": spent})
	}
	return l, res, false, nil
}

// release undoes a claim whose outcome is unknown; see Store.Release. It
// runs before the failed claim is answered, so that a redelivery finds the
// key free, and is bounded by StoreTimeout, so a failed claim is answered
// within twice StoreTimeout. A store that refuses connections answers at
// once; one that does not answer at all cannot release the key either: if
// the claim was applied, the key then waits for its lease to lapse, and the
// lapse counts as an attempt.
func (o *Once) release(key, token string, dv delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.StoreTimeout)
	defer cancel()
	start := o.startTimer()
	err := o.cfg.Store.Release(ctx, key, token)
	o.observe(OpRelease, start, err)
	if err != nil {
		o.logInfo("Could not release a claim whose reply was lost; the key is free when its lease lapses", dv, watermill.LogFields{"err": err})
	}
}

// errOutcomes names the outcomes of the errors of one step of the protocol:
// the first sentinel an error matches (errors.Is) decides.
type errOutcomes []struct {
	err     error
	outcome Outcome
}

// of returns the outcome of the first sentinel err matches, or otherwise
// when it matches none.
func (t errOutcomes) of(err error, otherwise Outcome) Outcome {
	for _, e := range t {
		if errors.Is(err, e.err) {
			return e.outcome
		}
	}
	return otherwise
}

// The outcomes of the errors of Once.claim, then of Lease.Complete.
var (
	claimOutcomes = errOutcomes{
		{ErrMissingKey, OutcomeMissingKey},
		{ErrCorruptRecord, OutcomeCorruptRecord},
		{ErrTooManyAttempts, OutcomeTooManyAttempts},
	}
	completeOutcomes = errOutcomes{
		{ErrLeaseLost, OutcomeLeaseLost},
		{ErrCorruptRecord, OutcomeCorruptRecord},
	}
)

// claimOutcome names the outcome of an error returned by Once.claim:
// OutcomeStoreUnavailable unless claimOutcomes says otherwise.
func claimOutcome(claimErr error) Outcome {
	return claimOutcomes.of(claimErr, OutcomeStoreUnavailable)
}

// CompleteOutcome names the outcome of a run whose work succeeded, from the
// error of Lease.Complete: OutcomeProcessed, OutcomeLeaseLost,
// OutcomeCorruptRecord or OutcomeCompleteFailed. An adapter built on
// Claim reports it (ReportOutcome), so that its outcomes mean what the
// middleware's and Do's mean.
func CompleteOutcome(completeErr error) Outcome {
	if completeErr == nil {
		return OutcomeProcessed
	}
	return completeOutcomes.of(completeErr, OutcomeCompleteFailed)
}

// startTimer returns the start of a store call to observe, or the zero
// time when nobody observes (saving a clock read per call).
func (o *Once) startTimer() time.Time {
	if o.timed {
		return time.Now()
	}
	return time.Time{}
}

// observe reports a store call that began at start, if anyone listens.
func (o *Once) observe(op Op, start time.Time, err error) {
	if o.timed {
		o.cfg.Observer.StoreLatency(op, time.Since(start), err)
	}
}

// storeCtx bounds one store call by d, unless the store is in process and
// cannot hang.
func (o *Once) storeCtx(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if o.inProcess {
		return parent, func() {}
	}
	return context.WithTimeout(parent, d)
}

// done logs and counts one outcome.
func (o *Once) done(outcome Outcome, dv delivery, err error) {
	if o.detailed {
		ctx := dv.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		o.cfg.Observer.(ContextObserver).OutcomeContext(ctx, OutcomeDetails{Handler: dv.scope, Scope: dv.scope,
			Key: dv.key, Outcome: outcome, Attempt: dv.attempts, Replayed: outcome == OutcomeDuplicate, Err: err})
	} else {
		o.cfg.Observer.Outcome(dv.scope, outcome)
	}
	if o.quiet {
		return
	}
	fields := dv.fields()
	fields["outcome"] = string(outcome)
	switch outcome {
	case OutcomeProcessed, OutcomeDuplicate, OutcomeInProgress:
		o.logger.Debug("Idempotency outcome", fields)
	case OutcomeHandlerFailed, OutcomeCallerGone:
		fields["err"] = err
		o.logger.Info("Idempotency outcome", fields)
	default:
		o.logger.Error("Idempotency outcome", err, fields)
	}
}

// delivery is what the logs say about one run. Its fields are built only
// when something is logged: the hot path of a quiet middleware allocates no
// map.
type delivery struct {
	uuid, scope, key string
	attempts         int
	extra            watermill.LogFields
	// ctx is the message's or caller's context, for a ContextObserver; in
	// a Lease, the claim's context, which the lease's context derives from.
	ctx context.Context
}

func (dv delivery) fields() watermill.LogFields {
	f := watermill.LogFields{}
	if dv.uuid != "" { // a Watermill message: its handler's name, even empty
		f["message_uuid"] = dv.uuid
		f["handler_name"] = dv.scope
	} else if dv.scope != "" {
		f["handler_name"] = dv.scope
	}
	if dv.key != "" {
		f["idempotency_key"] = dv.key
	}
	if dv.attempts > 0 {
		f["attempts"] = dv.attempts
	}
	return f.Add(dv.extra)
}

func (o *Once) logDebug(msg string, dv delivery) {
	if !o.quiet {
		o.logger.Debug(msg, dv.fields())
	}
}

func (o *Once) logInfo(msg string, dv delivery, extra watermill.LogFields) {
	if !o.quiet {
		o.logger.Info(msg, dv.fields().Add(extra))
	}
}

func (o *Once) logError(msg string, err error, dv delivery) {
	if !o.quiet {
		o.logger.Error(msg, err, dv.fields())
	}
}
