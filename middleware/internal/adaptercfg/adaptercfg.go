// Package adaptercfg holds the settings that the Configs of packages
// httpidem and grpcidem still copy, until they are built on a shared
// *idempotency.Once: their defaults, their checks, the Once built from
// them, and the level at which each outcome is logged.
package adaptercfg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// The owner protocol's defaults, as OnceConfig documents them.
const (
	DefaultLeaseTTL      = 40 * time.Second
	DefaultStoreTimeout  = 5 * time.Second
	DefaultCompletedTTL  = 24 * time.Hour
	DefaultFailedTTL     = 24 * time.Hour
	DefaultCacheTTL      = time.Minute
	DefaultCacheMaxBytes = 16 << 20
	// DefaultMaxKeyLength is the longest client key the adapters still
	// accept (Stripe's bound); adapter.StoreKey hashes those over
	// adapter.MaxKeyLength.
	DefaultMaxKeyLength = 255
	// DefaultRetryAfter is adapter.DefaultRetryAfter.
	DefaultRetryAfter = adapter.DefaultRetryAfter
)

// Common is what the Configs of every adapter have, under the same names
// and with the same meaning, plus what names the adapter in its errors.
type Common struct {
	// Invalid and NilStore are the adapter's ErrInvalidConfig and
	// ErrNilStore; Unit is what its Scope scopes: "request", "call".
	Invalid, NilStore error
	Unit              string

	Store        idempotency.Store
	Scoped       bool // the adapter's Config.Scope is set
	SingleTenant bool
	KeyPrefix    string
	MaxKeyLength int
	LeaseTTL     time.Duration
	StoreTimeout time.Duration
	CompletedTTL time.Duration
	FailedTTL    time.Duration
	RetryAfter   time.Duration
	// The cache of COMPLETED records, as idempotency.OnceConfig has it.
	CacheTTL      time.Duration
	CacheMaxBytes int
	DisableCache  bool
	Observer      idempotency.Observer
}

// WithDefaults returns c with every zero setting replaced by its default:
// keyPrefix (the adapter's own), DefaultMaxKeyLength, DefaultRetryAfter,
// and the owner protocol's defaults for the lease, the TTLs, the store
// timeout and the cache.
func (c Common) WithDefaults(keyPrefix string) Common {
	c.KeyPrefix = cmp.Or(c.KeyPrefix, keyPrefix)
	c.MaxKeyLength = cmp.Or(c.MaxKeyLength, DefaultMaxKeyLength)
	c.RetryAfter = cmp.Or(c.RetryAfter, DefaultRetryAfter)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.CompletedTTL = cmp.Or(c.CompletedTTL, DefaultCompletedTTL)
	c.FailedTTL = cmp.Or(c.FailedTTL, DefaultFailedTTL)
	c.CacheTTL = cmp.Or(c.CacheTTL, DefaultCacheTTL)
	c.CacheMaxBytes = cmp.Or(c.CacheMaxBytes, DefaultCacheMaxBytes)
	return c
}

// Check returns a configerr.List holding the problems of the shared
// settings, in this order: Store (NilStore), Scope and SingleTenant (one of
// them, not both), LeaseTTL, StoreTimeout, CompletedTTL, FailedTTL,
// RetryAfter and CacheTTL (none negative; LeaseTTL long enough to renew;
// the lease and the TTLs at most idempotency.MaxTTL), KeyPrefix (no
// colon), MaxKeyLength and CacheMaxBytes (neither negative). The adapter
// adds the problems of its own fields after these. Zero settings are
// valid: they stand for their defaults.
func (c Common) Check() *configerr.List {
	l := configerr.New(c.Invalid)
	if c.Store == nil {
		l.Add(c.NilStore)
	}
	switch {
	case !c.Scoped && !c.SingleTenant:
		l.Addf("Scope is required (the tenant of a %s); set SingleTenant instead only when one client calls this service", c.Unit)
	case c.Scoped && c.SingleTenant:
		l.Addf("Scope and SingleTenant are both set; choose one")
	}
	configerr.TTL(l, "LeaseTTL", c.LeaseTTL)
	configerr.NotNegative(l, "StoreTimeout", c.StoreTimeout)
	configerr.TTL(l, "CompletedTTL", c.CompletedTTL)
	configerr.TTL(l, "FailedTTL", c.FailedTTL)
	configerr.NotNegative(l, "RetryAfter", c.RetryAfter)
	configerr.TTL(l, "CacheTTL", c.CacheTTL)
	configerr.Renewable(l, c.LeaseTTL)
	configerr.KeyPrefix(l, c.KeyPrefix)
	configerr.NotNegative(l, "MaxKeyLength", c.MaxKeyLength)
	configerr.NotNegative(l, "CacheMaxBytes", c.CacheMaxBytes)
	return l
}

// NewOnce returns the owner protocol for c, which claims, renews, completes
// and fails the keys (the adapter only decides what each outcome means on
// its wire), and the logger to use: logger, or watermill.NopLogger for nil.
// An error matches c.Invalid; it does not happen for settings that Check
// accepts.
func (c Common) NewOnce(logger watermill.LoggerAdapter) (*idempotency.Once, watermill.LoggerAdapter, error) {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	cacheMaxBytes := c.CacheMaxBytes
	if c.DisableCache {
		cacheMaxBytes = -1
	}
	// CacheTTL is the Once's own (a minute) until the adapter drops it.
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: c.Store, Observer: c.Observer, Logger: logger,
		LeaseTTL: c.LeaseTTL, StoreTimeout: c.StoreTimeout, CompletedTTL: c.CompletedTTL, FailedTTL: c.FailedTTL,
		CacheMaxBytes: cacheMaxBytes})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", c.Invalid, err)
	}
	return once, logger, nil
}

// ObserverOrNop returns the Observer to report to: c.Observer, or one that
// discards everything for nil.
func (c Common) ObserverOrNop() idempotency.Observer {
	if c.Observer == nil {
		return nopObserver{}
	}
	return c.Observer
}

type nopObserver struct{}

func (nopObserver) Outcome(context.Context, idempotency.OutcomeDetails) {}
func (nopObserver) StoreLatency(string, time.Duration, error)           {}
func (nopObserver) CacheLookup(string, bool)                            {}

// Report tells obs about one outcome, with ctx (context.Background() for
// nil).
func Report(ctx context.Context, obs idempotency.Observer, d idempotency.OutcomeDetails) {
	if ctx == nil {
		ctx = context.Background()
	}
	obs.Outcome(ctx, d)
}

// LogOutcome logs one outcome with fields (copied, plus "outcome"): what
// the client did wrong and what went as planned at Debug, a failed handler
// and a caller that gave up at Info, and what an operator must look at (the
// store, a corrupt record, a result not recorded) at Error.
func LogOutcome(logger watermill.LoggerAdapter, fields watermill.LogFields, outcome idempotency.Outcome, err error) {
	fields = fields.Copy()
	fields["outcome"] = string(outcome)
	switch outcome {
	case idempotency.OutcomeProcessed, idempotency.OutcomeDuplicate, idempotency.OutcomeInProgress,
		idempotency.OutcomeKeyReused, idempotency.OutcomeMissingKey:
		logger.Debug("Idempotency outcome", fields)
	case idempotency.OutcomeHandlerFailed, idempotency.OutcomeCallerGone:
		fields["err"] = err
		logger.Info("Idempotency outcome", fields)
	default:
		logger.Error("Idempotency outcome", err, fields)
	}
}

// ErrKeyTooLong is what CheckKey says of a key over its bound.
var ErrKeyTooLong = errors.New("is too long")

// CheckKey is adapter.CheckKey, and refuses a key over maxLen bytes, as the
// adapters' MaxKeyLength still does; adapter.StoreKey hashes long keys.
func CheckKey(k string, maxLen int) error {
	if err := adapter.CheckKey(k); err != nil {
		return err
	}
	if len(k) > maxLen {
		return ErrKeyTooLong
	}
	return nil
}

// StoreKey is adapter.StoreKey with a hashed scope.
func StoreKey(prefix, scope, key string) string { return adapter.StoreKey(prefix, scope, key, true) }
