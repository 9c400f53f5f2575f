package adapter

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Defaults of the shared settings that the owner protocol does not define.
const (
	// DefaultMaxKeyLength is the longest client key accepted, in bytes
	// (Stripe's documented bound).
	DefaultMaxKeyLength = 255
	// DefaultRetryAfter is how long a client is told to wait before it
	// retries a key in progress, or a store that cannot be reached.
	DefaultRetryAfter = time.Second
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
	c.LeaseTTL = cmp.Or(c.LeaseTTL, idempotency.DefaultLeaseTTL)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, idempotency.DefaultStoreTimeout)
	c.CompletedTTL = cmp.Or(c.CompletedTTL, idempotency.DefaultCompletedTTL)
	c.FailedTTL = cmp.Or(c.FailedTTL, idempotency.DefaultFailedTTL)
	c.CacheTTL = cmp.Or(c.CacheTTL, idempotency.DefaultCacheTTL)
	c.CacheMaxBytes = cmp.Or(c.CacheMaxBytes, idempotency.DefaultCacheMaxBytes)
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
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: c.Store, Observer: c.Observer,
		LeaseTTL: c.LeaseTTL, StoreTimeout: c.StoreTimeout, CompletedTTL: c.CompletedTTL, FailedTTL: c.FailedTTL,
		CacheTTL: c.CacheTTL, CacheMaxBytes: c.CacheMaxBytes, DisableCache: c.DisableCache}, logger)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", c.Invalid, err)
	}
	return once, logger, nil
}

// RunHandler calls handler as the key's owner, under lease. Should handler
// panic, the key is FAILED (lease.Fail), panicked counts and logs that, and
// the panic goes on to the outer recovery (or net/http, or crashes a gRPC
// server without one), as if the adapter were absent.
func RunHandler(lease *idempotency.Lease, panicked func(err error), handler func()) {
	finished := false
	defer func() {
		if !finished {
			lease.Fail()
			panicked(errors.New("handler panicked"))
		}
	}()
	handler()
	finished = true
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

func (nopObserver) Outcome(string, idempotency.Outcome)               {}
func (nopObserver) StoreLatency(idempotency.Op, time.Duration, error) {}

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
