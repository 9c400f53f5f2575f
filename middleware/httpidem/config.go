package httpidem

import (
	"cmp"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// The defaults of the fields of Config and Transport that are this
// package's own.
const (
	defaultHeader          = "Idempotency-Key" // the IETF draft's name
	defaultKeyPrefix       = "httpidem"        // not the Watermill middleware's "idem"
	defaultMaxRequestBody  = 10 << 20
	defaultMaxResponseBody = 1 << 20
	defaultProblemTypeBase = "https://github.com/idempotency/watermill-idempotency/blob/main/docs/GUARANTEES.md#"
	defaultOutcomeLabel    = "http" // the Observer's label without a ServeMux pattern
)

// Errors of an invalid Config, checked with errors.Is.
var (
	// ErrInvalidConfig is matched by every problem that Config.Validate and
	// New report: a negative duration or size, a malformed header name or
	// method, a Config that sets neither Scope nor SingleTenant, or both,
	// and a missing Store; and by every problem of a TransportConfig that
	// NewTransport reports.
	ErrInvalidConfig = errors.New("httpidem: invalid config")
	// ErrNilStore is matched, beside ErrInvalidConfig, by the problem of a
	// Config without a Store.
	ErrNilStore = errors.New("httpidem: nil store")
)

// Config configures a Middleware. Store is required, and so is the choice
// between Scope and SingleTenant; every other field has a usable zero value,
// documented on the field.
type Config struct {
	// Store keeps the state of every key. Required: there is no silent
	// default (use memstore for tests and demos, redisstore in production).
	Store idempotency.Store

	// Methods lists the request methods the middleware applies to; requests
	// with any other method pass through untouched. Methods are
	// case-sensitive, as in HTTP. Nil or empty means POST and PATCH.
	Methods []string

	// Header is the request header carrying the key. Empty means
	// defaultHeader ("Idempotency-Key").
	Header string

	// KeyOptional lets requests without the header pass through without
	// idempotency. False (the default) answers them 400: a payment API
	// should not silently lose the protection because a client forgot it.
	KeyOptional bool

	// Scope returns the scope of a request: the namespace part of its
	// stored key, as Config.Scope of package idempotency is for a message,
	// so that one key in two scopes is two keys. In HTTP it is derived per
	// request, from the tenant that sent it (an authenticated subject, an
	// API key id). Its SHA-256 is part of the stored key, so a client can
	// never receive the stored response of another scope, two tenants may
	// use the same key, and no scope (an API key, say) appears in a key
	// name. The scope of a request is what Scope returns, the empty
	// string included: put authentication before this middleware, so that
	// an anonymous request never reaches it. Required unless SingleTenant
	// is set (there is no safe default: one scope for every client would
	// let a client's key fetch another client's response); New refuses a
	// Config with neither, or with both.
	Scope func(r *http.Request) string

	// SingleTenant declares that every request belongs to one client (one
	// scope), so that no Scope is needed: a service called only by one
	// other service, say. Never set it for a public API: any client that
	// sends another client's key would get that client's stored response,
	// Set-Cookie included.
	SingleTenant bool

	// KeyPrefix starts every stored key; the middleware adds a colon after
	// it, as the Watermill middleware does after its Config.KeyPrefix. It
	// must not hold a colon itself. Empty means defaultKeyPrefix
	// ("httpidem").
	KeyPrefix string

	// LeaseTTL is how long a claim holds a key while the handler runs
	// (idempotency.OnceConfig.LeaseTTL): the middleware renews it every
	// LeaseTTL/3, and every LeaseTTL/10 after a renewal failed. When the
	// store says the lease is lost, or no renewal succeeds for nine tenths
	// of a LeaseTTL, the handler's context is cancelled with
	// idempotency.ErrLeaseLost as its cause, before the store can hand the
	// key to another request. A crashed server stops renewing, and after
	// LeaseTTL a retry runs the handler again (the lapsed run counts as a
	// failed attempt). Zero means DefaultLeaseTTL (40 s).
	LeaseTTL time.Duration

	// StoreTimeout bounds each store call: the claim, each renewal, and
	// each attempt to record the outcome; every call made while the key is
	// held is also bounded by what is left of the lease. A claim that times
	// out is answered 503 (or runs the handler, with FailOpen); a renewal
	// that times out is retried while the lease lasts; recording COMPLETED
	// is retried until the lease runs out. Zero means DefaultStoreTimeout
	// (5 s).
	StoreTimeout time.Duration

	// CompletedTTL is how long a completed response is kept and replayed.
	// Zero means DefaultCompletedTTL (24 h).
	CompletedTTL time.Duration

	// FailedTTL is how long a failed attempt (5xx, panic, lost lease) is
	// kept, and how long a key whose lease lapsed is kept after its lease
	// ended. A retry with the same request runs the handler again; one with
	// a different request is refused with 422 until it expires. Zero means
	// DefaultFailedTTL (24 h).
	FailedTTL time.Duration

	// CacheTTL is how long, at most, a key this process saw completed is
	// replayed from memory, without a store call
	// (idempotency.OnceConfig.CacheTTL): never past the record's own
	// CompletedTTL, and an operator's Delete of the key reaches this
	// process only when the entry ends. Zero means DefaultCacheTTL
	// (idempotency.DefaultCacheTTL, 1 min).
	CacheTTL time.Duration

	// CacheMaxBytes bounds the memory of that cache (keys, stored responses,
	// fingerprints and a fixed overhead per entry). Zero means
	// idempotency.DefaultCacheMaxBytes (16 MiB).
	CacheMaxBytes int

	// DisableCache sends every claim to the store. An in-process store
	// (memstore) is never cached anyway.
	DisableCache bool

	// MaxRequestBody bounds the request body, which is read in full to
	// fingerprint it before the handler runs. Larger bodies are answered
	// 413 without claiming the key. Zero means defaultMaxRequestBody
	// (10 MiB).
	MaxRequestBody int64

	// MaxResponseBody bounds the response body stored for replay. A larger
	// response still goes to the first client in full, and the key is
	// completed without it: repeats are answered 410 (ProblemResponseNotStored).
	// Zero means defaultMaxResponseBody (1 MiB).
	MaxResponseBody int

	// RetryAfter is the Retry-After sent when the key is in progress (409)
	// or the store is unavailable (503), rounded up to whole seconds. Zero
	// means adapter.DefaultRetryAfter (1 s).
	RetryAfter time.Duration

	// FailOpen runs the handler without idempotency when the store cannot be
	// reached, and logs it. False (the default) fails closed: 503, the
	// handler does not run, and the client retries later.
	FailOpen bool

	// ProblemTypeBase starts the "type" member of problem bodies; the
	// ProblemType follows. Empty means defaultProblemTypeBase.
	ProblemTypeBase string

	// Observer receives one outcome per request the middleware applies to
	// (the same idempotency.Observer as the Watermill middleware's, so
	// idemprom counts both) and the latency of every store call. Its label
	// is the request's ServeMux pattern (http.Request.Pattern, such as
	// "POST /payments") when the middleware wraps a handler registered on a
	// ServeMux, else defaultOutcomeLabel ("http"): never the scope or the
	// path, whose values are unbounded. Wrap each route's handler, not the
	// whole mux, to count per route. Nil means none.
	Observer idempotency.Observer
}

func (c *Config) setDefaults() {
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		c.Methods = slices.Clone(c.Methods)
	}
	c.Header = http.CanonicalHeaderKey(cmp.Or(c.Header, defaultHeader))
	c.MaxRequestBody = cmp.Or(c.MaxRequestBody, defaultMaxRequestBody)
	c.MaxResponseBody = cmp.Or(c.MaxResponseBody, defaultMaxResponseBody)
	c.ProblemTypeBase = cmp.Or(c.ProblemTypeBase, defaultProblemTypeBase)
	shared := c.common().WithDefaults(defaultKeyPrefix)
	c.KeyPrefix, c.RetryAfter = shared.KeyPrefix, shared.RetryAfter
	c.LeaseTTL, c.StoreTimeout, c.CompletedTTL, c.FailedTTL = shared.LeaseTTL, shared.StoreTimeout, shared.CompletedTTL, shared.FailedTTL
	c.CacheTTL, c.CacheMaxBytes = shared.CacheTTL, shared.CacheMaxBytes
}

// Validate reports every problem of the config, not only the first:
// errors.Join of one error per problem, each matching ErrInvalidConfig (a
// missing Store matches ErrNilStore as well), in this fixed order: Store;
// Scope and SingleTenant (one of them, not both); LeaseTTL, StoreTimeout,
// CompletedTTL, FailedTTL, RetryAfter and CacheTTL (none negative, LeaseTTL
// at least 3 ms); MaxKeyLength, CacheMaxBytes, MaxRequestBody and
// MaxResponseBody (none negative); Header (a header name); Methods (each
// a method name). Zero fields other than Store, Scope and SingleTenant are
// valid: they stand for their defaults. New calls it after filling the defaults.
func (c Config) Validate() error {
	l := c.common().Check()
	configerr.NotNegative(l, "MaxRequestBody", c.MaxRequestBody)
	configerr.NotNegative(l, "MaxResponseBody", c.MaxResponseBody)
	if c.Header != "" && !isToken(c.Header) {
		l.Addf("Header %q is not a header name", c.Header)
	}
	for _, m := range c.Methods {
		if !isToken(m) {
			l.Addf("method %q is not a method name", m)
		}
	}
	return l.Err()
}

// common is what c shares, field for field, with the Config of package
// grpcidem.
func (c Config) common() adapter.Common {
	return adapter.Common{Invalid: ErrInvalidConfig, NilStore: ErrNilStore, Unit: "request", Store: c.Store, Observer: c.Observer,
		Scoped: c.Scope != nil, SingleTenant: c.SingleTenant, KeyPrefix: c.KeyPrefix, RetryAfter: c.RetryAfter,
		LeaseTTL: c.LeaseTTL, StoreTimeout: c.StoreTimeout, CompletedTTL: c.CompletedTTL, FailedTTL: c.FailedTTL,
		CacheTTL: c.CacheTTL, CacheMaxBytes: c.CacheMaxBytes, DisableCache: c.DisableCache}
}

// isToken reports whether s is an RFC 9110 token (header names, methods).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c > 0x20 && c < 0x7f && strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) < 0:
		default:
			return false
		}
	}
	return true
}
