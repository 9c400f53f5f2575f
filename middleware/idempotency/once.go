package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/inprocess"
)

// The defaults of OnceConfig, applied in one place (setDefaults).
const (
	defaultLeaseTTL      = 40 * time.Second
	defaultCompletedTTL  = 24 * time.Hour
	defaultFailedTTL     = 24 * time.Hour
	defaultStoreTimeout  = 5 * time.Second
	defaultMaxOutputSize = 1 << 20
	defaultCacheMaxBytes = 16 << 20
	// doLabel labels the outcomes and cache lookups of Once.Do.
	doLabel = "once"
)

// OnceConfig configures a [Once]: the settings that the Watermill
// middleware, package httpidem and package grpcidem share. A zero field
// means its default; only Store is required.
type OnceConfig struct {
	// Store keeps the state of every key. Required.
	Store Store
	// Logger logs outcomes and trouble. The default logs nothing.
	Logger watermill.LoggerAdapter
	// Observer receives outcomes and store latencies. The default is none.
	Observer Observer
	// LeaseTTL is how long a claim holds a key without renewal. The owner
	// renews it every LeaseTTL/3. The default is 40 s.
	LeaseTTL time.Duration
	// CompletedTTL is how long a completed key and its output are kept.
	// The default is 24 h.
	CompletedTTL time.Duration
	// FailedTTL is how long a failed key keeps its attempt count. The
	// default is 24 h.
	FailedTTL time.Duration
	// StoreTimeout bounds each store call, as does what is left of the
	// lease. The default is 5 s.
	StoreTimeout time.Duration
	// MaxAttempts is how many times the work may run for one key. The
	// default, 0, is unlimited.
	MaxAttempts int
	// MaxOutputSize bounds a stored output in bytes: a Watermill handler's
	// messages, an HTTP response, a gRPC response. The default is 1 MiB.
	MaxOutputSize int
	// CacheMaxBytes bounds the memory of the cache of COMPLETED keys. A
	// negative value disables it. The default is 16 MiB.
	CacheMaxBytes int
	// FailOpen runs the work without deduplication when the store cannot
	// be reached for the claim. The default fails closed.
	FailOpen bool
}

// setDefaults fills the zero fields of c.
func (c *OnceConfig) setDefaults() {
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	c.LeaseTTL = cmp.Or(c.LeaseTTL, defaultLeaseTTL)
	c.CompletedTTL = cmp.Or(c.CompletedTTL, defaultCompletedTTL)
	c.FailedTTL = cmp.Or(c.FailedTTL, defaultFailedTTL)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, defaultStoreTimeout)
	c.MaxOutputSize = cmp.Or(c.MaxOutputSize, defaultMaxOutputSize)
	c.CacheMaxBytes = cmp.Or(c.CacheMaxBytes, defaultCacheMaxBytes)
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
	configerr.NotNegative(problems, "MaxOutputSize", c.MaxOutputSize)
}

// Once is the owner's side of the protocol, written once for every
// adapter. It claims a key, renews the lease while the work runs, and
// completes or fails it. Build one per process and share it: it holds the
// one cache of COMPLETED keys. It is safe for concurrent use.
type Once struct {
	cfg    OnceConfig
	logger watermill.LoggerAdapter
	// observer is cfg.Observer, nil for none.
	observer Observer
	// inProcess: the store never waits on I/O, so calls need no timeout.
	inProcess bool
	// quiet: the logger discards everything, so no log fields are built.
	quiet bool
	// cache holds the COMPLETED records this process saw; nil when off.
	cache *completedCache
	// prefixes maps each KeyPrefix of o's adapters to whether they hash
	// the scope (httpidem, grpcidem) or escape it (Watermill).
	prefixMu sync.Mutex
	prefixes map[string]bool
}

func init() {
	adapter.UsePrefix = func(once any, prefix string, hashScope bool) error {
		return once.(*Once).usePrefix(prefix, hashScope)
	}
}

// usePrefix is adapter.UsePrefix: one prefix, one layout of stored keys.
func (o *Once) usePrefix(prefix string, hashScope bool) error {
	o.prefixMu.Lock()
	defer o.prefixMu.Unlock()
	if hashed, ok := o.prefixes[prefix]; ok && hashed != hashScope {
		return fmt.Errorf("KeyPrefix %q is another adapter's on this Once (the Watermill middleware's stores its scope as text, httpidem's and grpcidem's as a hash): give each its own", prefix)
	}
	if o.prefixes == nil {
		o.prefixes = map[string]bool{}
	}
	o.prefixes[prefix] = hashScope
	return nil
}

// NewOnce returns the protocol for cfg. It fills the defaults of the zero
// fields and reports every problem of cfg at once, each matching
// [ErrInvalidConfig].
func NewOnce(cfg OnceConfig) (*Once, error) {
	cfg.setDefaults()
	problems := configerr.New(ErrInvalidConfig)
	cfg.check(problems)
	if err := problems.Err(); err != nil {
		return nil, err
	}
	inProcess := inprocess.Is(cfg.Store)
	_, quiet := cfg.Logger.(watermill.NopLogger)
	o := &Once{cfg: cfg, logger: cfg.Logger, observer: cfg.Observer, inProcess: inProcess, quiet: quiet}
	// An in-process store answers from memory already: a cache would only
	// hold a second copy of its records.
	if cfg.CacheMaxBytes > 0 && !inProcess {
		o.cache = newCompletedCache(cacheTTL, cfg.CacheMaxBytes)
	}
	return o, nil
}

// Config returns the configuration in force, defaults filled. Adapters
// read their shared settings from it.
func (o *Once) Config() OnceConfig { return o.cfg }

// Report logs and counts one outcome of an adapter built on [Once.Claim],
// as the Watermill middleware and [Once.Do] report theirs. A missing or
// reused key is the client's mistake, logged at Debug.
func (o *Once) Report(ctx context.Context, d OutcomeDetails) {
	o.report(d.Outcome, delivery{scope: d.Handler, key: d.Key, attempts: d.Attempt, ctx: ctx}, d.Err, true)
}

// Result is what [Once.Do] returns for a key.
type Result struct {
	// Value is what the work returned, or, for a duplicate, what its first
	// successful run returned and the store kept.
	Value []byte
	// Outcome says what happened: OutcomeProcessed, OutcomeDuplicate (the
	// work did not run), OutcomeFailOpen, or, when the value could not be
	// recorded, OutcomeCompleteFailed or OutcomeLeaseLost.
	Outcome Outcome
}

// Do runs work once per key across every process sharing the store. Later
// callers get its value back while the key is COMPLETED, with
// OutcomeDuplicate. The work's context is cancelled, with cause
// [ErrLeaseLost], if the lease is lost.
//
// Do returns the work's error, and the key is FAILED. It returns
// [ErrInProgress] while another caller holds the key, and
// [ErrStoreUnavailable], [ErrCorruptRecord] or [ErrTooManyAttempts] when
// nothing ran. A panic fails the key and goes on. With FailOpen, a store
// that cannot be reached runs the work unguarded: [OutcomeFailOpen].
//
// The key is used as given: prefix it when the store is shared. The value
// is stored whole: MaxOutputSize does not bound it.
func (o *Once) Do(ctx context.Context, key string, work func(ctx context.Context) ([]byte, error)) (Result, error) {
	dv := delivery{scope: doLabel, key: key, ctx: ctx}
	lease, claim, cached, err := o.claim(ctx, key, nil, 0, dv)
	dv.attempts = claim.Record.Attempts
	if err != nil {
		if o.cfg.FailOpen && errors.Is(err, ErrStoreUnavailable) && ctx.Err() == nil {
			o.done(OutcomeFailOpen, dv, err)
			value, err := work(ctx)
			return Result{Value: value, Outcome: OutcomeFailOpen}, err
		}
		o.done(OutcomeOf(err), dv, err)
		return Result{}, err
	}
	if lease == nil {
		if claim.Record.State == StateCompleted {
			o.done(OutcomeDuplicate, dv, nil)
			if cached {
				claim.Record.Result = cloneBytes(claim.Record.Result)
			}
			return Result{Value: claim.Record.Result, Outcome: OutcomeDuplicate}, nil
		}
		err := fmt.Errorf("%w: key %q", ErrInProgress, key)
		o.done(OutcomeInProgress, dv, err)
		return Result{}, err
	}

	lease.do = true
	finished := false
	defer func() {
		if !finished {
			lease.Fail()
			o.done(OutcomeHandlerFailed, dv, errors.New("work panicked"))
		}
	}()
	value, err := work(lease.Context())
	finished = true
	res := Result{Value: value}
	if err != nil {
		lease.Fail()
		o.done(OutcomeHandlerFailed, dv, err)
		return res, err
	}
	cerr := lease.Complete(value)
	res.Outcome = OutcomeOf(cerr)
	o.done(res.Outcome, dv, cerr)
	return res, nil
}

// Claim claims key for an adapter that writes its result itself (package
// httpidem, package grpcidem); other code calls [Once.Do]. fingerprint is
// stored with a new record, and a claim with another one never acquires.
// Claim returns exactly one of:
//   - a [Lease]: run the work under [Lease.Context], then call
//     [Lease.Complete] or [Lease.Fail];
//   - no Lease and no error: the claim was refused, and
//     [ClaimResult.Record] says why (COMPLETED, held, or another
//     fingerprint); it may come from the cache, as a copy;
//   - an error, named by [OutcomeOf]: [ErrStoreUnavailable] (nothing is
//     claimed), [ErrCorruptRecord], [ErrMissingKey] for an empty key, or
//     [ErrTooManyAttempts].
//
// ctx bounds the claim and is the parent of the lease's context.
func (o *Once) Claim(ctx context.Context, key string, fingerprint []byte) (*Lease, ClaimResult, error) {
	lease, res, cached, err := o.claim(ctx, key, fingerprint, 0, delivery{key: key, scope: adapter.Label(ctx)})
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
	req := ClaimRequest{Token: storekit.NewToken(), Lease: o.cfg.LeaseTTL, TTL: o.cfg.FailedTTL, Fingerprint: fingerprint}
	claimed := time.Now() // the lease counts from before the claim's round trip
	cctx, cancel := o.storeCtx(ctx, o.cfg.StoreTimeout)
	start := o.startTimer()
	res, err := o.cfg.Store.Claim(cctx, key, req)
	gone := ctx.Err() != nil // judged before the release below waits on the store
	cancel()
	o.observe("claim", start, err)
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
			return nil, res, false, fmt.Errorf("%w: %w: %w", ErrStoreUnavailable, errCallerGone, err)
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

// release undoes a claim whose outcome is unknown, before the failed claim
// is answered, so a redelivery finds the key free. It is bounded by
// StoreTimeout; a store that does not answer leaves the lease to lapse.
func (o *Once) release(key, token string, dv delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.StoreTimeout)
	defer cancel()
	start := o.startTimer()
	err := o.cfg.Store.Release(ctx, key, token)
	o.observe("release", start, err)
	if err != nil {
		o.logInfo("Could not release a claim whose reply was lost; the key is free when its lease lapses", dv, watermill.LogFields{"err": err})
	}
}

// startTimer returns the start of a store call, or zero when nobody observes.
func (o *Once) startTimer() time.Time {
	if o.observer != nil {
		return time.Now()
	}
	return time.Time{}
}

// observe reports a store call that began at start, if anyone listens.
func (o *Once) observe(op string, start time.Time, err error) {
	if o.observer != nil {
		o.observer.StoreLatency(op, time.Since(start), err)
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

// done logs and counts one outcome: as planned at Debug, a failed run or a
// caller gone at Info, what an operator must look at at Error.
func (o *Once) done(outcome Outcome, dv delivery, err error) {
	o.report(outcome, dv, err, false)
}

// report is done; byClient logs a missing or reused key at Debug.
func (o *Once) report(outcome Outcome, dv delivery, err error, byClient bool) {
	if o.observer != nil {
		ctx := dv.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		o.observer.Outcome(ctx, OutcomeDetails{Handler: dv.scope, Key: dv.key, Outcome: outcome, Attempt: dv.attempts, Err: err})
	}
	if o.quiet {
		return
	}
	fields := dv.fields()
	fields["outcome"] = string(outcome)
	switch outcome {
	case OutcomeProcessed, OutcomeDuplicate, OutcomeInProgress:
		o.logger.Debug("Idempotency outcome", fields)
	case OutcomeKeyReused, OutcomeMissingKey:
		if byClient {
			o.logger.Debug("Idempotency outcome", fields)
		} else {
			o.logger.Error("Idempotency outcome", err, fields)
		}
	case OutcomeHandlerFailed, OutcomeCallerGone:
		fields["err"] = err
		o.logger.Info("Idempotency outcome", fields)
	default:
		o.logger.Error("Idempotency outcome", err, fields)
	}
}

// delivery is what the logs say about one run; fields are built only to log.
type delivery struct {
	uuid, scope, key string
	attempts         int
	// ctx is the message's or caller's context; in a Lease, the claim's.
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
	return f
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
