package idempotency

import (
	"cmp"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// Defaults of Config and OnceConfig: a zero field means the default of its
// name. They are exported so that code can derive a setting from a default
// instead of copying its number: a broker's redelivery timer above
// DefaultLeaseTTL, the adapters' configs (httpidem, grpcidem) that share
// the owner protocol's defaults, or the stored key of a message
// (DefaultKeyPrefix, see Keys in the package documentation).
const (
	DefaultKeyPrefix     = "idem"
	DefaultLeaseTTL      = 40 * time.Second
	DefaultCompletedTTL  = 24 * time.Hour
	DefaultFailedTTL     = 24 * time.Hour
	DefaultNackDelay     = time.Second
	DefaultMaxOutputSize = 1 << 20
	DefaultStoreTimeout  = 5 * time.Second
	DefaultMaxKeyLength  = 200
)

// MaxTTL is the longest lease or TTL that Config, OnceConfig and the
// adapters' configs accept: 100 years (of 365 days), as good as "forever"
// for a record, and short enough that every store holds it, and twice it,
// without overflow (Redis PX, PostgreSQL timestamps, a store's own clock
// arithmetic). A longer one is an invalid config: a TTL has no "no expiry"
// value. A store given a longer TTL directly holds the key for MaxTTL
// (ClampTTL).
const MaxTTL = configerr.MaxTTL

// DefaultKeyMetadata returns the metadata fields a key is read from when
// Config.KeyMetadata is nil, in order: "requestId", then "Idempotency-Key".
// It returns a new slice on every call, so that a config can add a field
// to the defaults without copying them, and without changing them for
// anyone else:
//
//	cfg.KeyMetadata = append(idempotency.DefaultKeyMetadata(), "orderId")
func DefaultKeyMetadata() []string { return []string{"requestId", "Idempotency-Key"} }

// Config configures a Middleware. A zero field means its
// documented default; only Store is required. LeaseTTL and the TTLs are at
// most MaxTTL.
type Config struct {
	// Store keeps the state of every key. Required: redisstore for effects
	// outside your database, pgstore or mysqlstore for effects in it
	// (committed with COMPLETED in one transaction), memstore for tests and
	// single-process demos.
	Store Store

	// KeyMetadata are the metadata fields read, in order, for the key; the
	// first non-empty one wins, else the message UUID is the key. Nil means
	// DefaultKeyMetadata() ("requestId", then "Idempotency-Key").
	KeyMetadata []string
	// KeyFunc, when set, replaces KeyMetadata and the UUID: it returns the
	// key of a message. An empty key or an error is ErrMissingKey.
	KeyFunc func(msg *message.Message) (string, error)
	// Scope returns the scope of a message: the namespace in the middle of
	// its stored key (prefix:scope:key), so that one key in two scopes is
	// two keys. The Config of packages httpidem and grpcidem has a Scope of
	// the same meaning, required there (see Names in the package
	// documentation). Nil means the handler's name
	// (message.HandlerNameFromCtx, which the router puts in the message's
	// context), so that two handlers consuming one topic each process a
	// message once (each needs a subscriber of its own consumer group for
	// that).
	Scope func(msg *message.Message) string
	// KeyPrefix starts every stored key: prefix:scope:key. It must not hold
	// a colon, so that no prefix, scope and key store under the key of
	// another ("shop:billing", "charge", "order-7" would be "shop",
	// "billing", "charge:order-7"): use another separator ("shop.billing").
	// Empty means DefaultKeyPrefix ("idem").
	KeyPrefix string
	// MaxKeyLength bounds the key part in bytes; a longer key is replaced by
	// "sha256:" and its hex SHA-256. Zero means DefaultMaxKeyLength (200).
	MaxKeyLength int

	// LeaseTTL is how long a claim holds a key without renewal; the
	// middleware renews it every LeaseTTL/3 while the handler runs, so only
	// a consumer that stopped (crashed, partitioned) loses it. Keep it well
	// above a store round trip and below the broker's redelivery timer (AMQP
	// consumer timeout, NATS AckWait, Redis Streams MaxIdleTime) where
	// possible. Zero means DefaultLeaseTTL (40 s); at most MaxTTL.
	LeaseTTL time.Duration
	// CompletedTTL is how long a completed key is remembered: duplicates
	// arriving later run the handler again. Zero means DefaultCompletedTTL
	// (24 h); at most MaxTTL (100 years), there is no "never expires".
	CompletedTTL time.Duration
	// FailedTTL is how long a failed key keeps its attempt count, and how
	// long the record of a consumer that died mid-handler outlives its lapsed
	// lease, so that crash loops count towards MaxAttempts. Zero means
	// DefaultFailedTTL (24 h); at most MaxTTL.
	FailedTTL time.Duration
	// NackDelay is how long the middleware waits before it nacks a copy
	// whose key another consumer holds (ErrInProgress) or that it could not
	// claim because the store is down (ErrStoreUnavailable), so that brokers
	// which redeliver at once (gochannel, AMQP) do not spin. Zero means
	// DefaultNackDelay (1 s); negative means no delay.
	NackDelay time.Duration
	// MaxAttempts is how many times the handler may run for one key; a copy
	// arriving after that many failures (errors, panics, or consumers that
	// died with the lease) gets ErrTooManyAttempts without running the
	// handler. A copy requeued from the handler's poison queue gets
	// MaxAttempts more (see Poison messages in the package documentation).
	// Zero means unlimited.
	MaxAttempts int

	// FailOpen runs the handler without deduplication when the store cannot
	// be reached for the claim, logging and counting it (OutcomeFailOpen).
	// False (the default) fails closed: the message is nacked and nothing is
	// lost.
	FailOpen bool
	// DisableOutputReplay stores no output: a duplicate is acked without
	// republishing what the first run produced. False (the default) stores
	// the handler's produced messages and returns them for every duplicate,
	// so a publish that failed after completion is retried by redelivery.
	DisableOutputReplay bool
	// MaxOutputSize bounds the stored output in bytes (encoded: UUIDs,
	// metadata and payloads); a larger output is not stored: the key is
	// still COMPLETED, the run is logged at Error and counted as
	// OutcomeOutputNotStored, and duplicates are acked without it. Such an
	// output is at most once: if the router's publish of it fails, the
	// redelivery is acked as a duplicate and the output is lost. Zero means
	// DefaultMaxOutputSize (1 MiB).
	MaxOutputSize int
	// CheckPayload stores the SHA-256 of the payload with the key; a copy
	// with the same key and a different payload gets ErrKeyReused. False
	// (the default) compares keys only.
	CheckPayload bool
	// StoreTimeout bounds each store call; once the key is claimed, each
	// call is bounded by what is left of the lease as well. Zero means
	// DefaultStoreTimeout (5 s).
	StoreTimeout time.Duration

	// CacheTTL is how long, at most, a key this process saw COMPLETED is
	// answered from memory, without a store call: a duplicate is then acked
	// with its stored output as from the store (see OnceConfig.CacheTTL for
	// how an entry is bounded by the record's own CompletedTTL). The one
	// exception to COMPLETED being final: a key an operator deletes
	// (Store.Delete, idemctl) is run again by the other processes at once,
	// but by one that cached it only when its entry ends, up to CacheTTL
	// later. Zero means DefaultCacheTTL (1 min).
	CacheTTL time.Duration
	// CacheMaxBytes bounds the memory of the cache (keys, stored outputs,
	// fingerprints and a fixed overhead per entry); the least recently used
	// entries go first. Zero means DefaultCacheMaxBytes (16 MiB).
	CacheMaxBytes int
	// DisableCache sends every claim to the store. An in-process store
	// (memstore) is never cached anyway.
	DisableCache bool

	// Observer receives outcomes and store latencies. Nil means none; see
	// package idemprom for Prometheus. One that is also a CacheObserver
	// counts the cache's hits and misses.
	Observer Observer
}

func (c *Config) setDefaults() {
	if c.KeyMetadata == nil {
		c.KeyMetadata = DefaultKeyMetadata()
	} else {
		c.KeyMetadata = append([]string(nil), c.KeyMetadata...) // the caller's slice may change
	}
	if c.Scope == nil {
		c.Scope = func(msg *message.Message) string { return message.HandlerNameFromCtx(msg.Context()) }
	}
	c.KeyPrefix = cmp.Or(c.KeyPrefix, DefaultKeyPrefix)
	c.MaxKeyLength = cmp.Or(c.MaxKeyLength, DefaultMaxKeyLength)
	c.NackDelay = cmp.Or(c.NackDelay, DefaultNackDelay)
	c.MaxOutputSize = cmp.Or(c.MaxOutputSize, DefaultMaxOutputSize)
	// The owner protocol's fields have the owner protocol's defaults.
	oc := c.onceConfig()
	oc.setDefaults()
	c.LeaseTTL, c.CompletedTTL, c.FailedTTL, c.StoreTimeout, c.Observer = oc.LeaseTTL, oc.CompletedTTL, oc.FailedTTL, oc.StoreTimeout, oc.Observer
	c.CacheTTL, c.CacheMaxBytes = oc.CacheTTL, oc.CacheMaxBytes
}

// onceConfig is the part of c that configures the owner protocol.
func (c Config) onceConfig() OnceConfig {
	return OnceConfig{
		Store:         c.Store,
		LeaseTTL:      c.LeaseTTL,
		CompletedTTL:  c.CompletedTTL,
		FailedTTL:     c.FailedTTL,
		StoreTimeout:  c.StoreTimeout,
		MaxAttempts:   c.MaxAttempts,
		CacheTTL:      c.CacheTTL,
		CacheMaxBytes: c.CacheMaxBytes,
		DisableCache:  c.DisableCache,
		Observer:      c.Observer,
	}
}

// Validate reports every problem of c, joined in the order of its fields;
// each matches ErrInvalidConfig. New calls it. A zero field is valid (it
// means its default), so a program may also call it on a config as
// written, to report every problem at start-up beside its other settings.
func (c Config) Validate() error {
	problems := configerr.New(ErrInvalidConfig)
	c.onceConfig().check(problems)
	configerr.KeyPrefix(problems, c.KeyPrefix)
	configerr.NotNegative(problems, "MaxKeyLength", c.MaxKeyLength)
	configerr.NotNegative(problems, "MaxOutputSize", c.MaxOutputSize)
	for _, f := range c.KeyMetadata {
		if f == "" {
			problems.Addf("KeyMetadata has an empty field name")
		}
	}
	return problems.Err()
}
