package grpcidem

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// Errors of an invalid Config or ClientConfig, checked with errors.Is.
var (
	// ErrInvalidConfig is matched by every problem that Config.Validate,
	// New and NewClient report: a Config without Methods, a malformed
	// method, metadata or field name, a negative duration or size, a
	// Config that sets neither Scope nor SingleTenant, or both, and a
	// missing Store.
	ErrInvalidConfig = errors.New("grpcidem: invalid config")
	// ErrNilStore is matched, beside ErrInvalidConfig, by the problem of a
	// Config without a Store.
	ErrNilStore = errors.New("grpcidem: nil store")
)

// The defaults of the fields of Config and Client that are this
// package's own.
const (
	defaultMetadata        = "idempotency-key" // the HTTP header's gRPC spelling
	defaultRequestField    = "request_id"      // as AIP-155 names it
	defaultKeyPrefix       = "grpcidem"        // not "idem" nor "httpidem"
	defaultMaxResponseSize = 1 << 20
)

// Config configures a Middleware. Store, Methods and the choice between
// Scope and SingleTenant are required; every other field has a usable zero
// value, documented on the field.
type Config struct {
	// Store keeps the state of every key. Required: there is no silent
	// default (use memstore for tests and demos, redisstore in production).
	Store idempotency.Store

	// Methods lists the full names of the unary methods the interceptor
	// applies to, as grpc.UnaryServerInfo.FullMethod spells them
	// ("/payments.v1.Payments/CreatePayment"). Calls of any other method
	// pass through untouched. Required: gRPC has no verb that says which
	// calls have effects, so the service says it. Each is looked up in the
	// protobuf registry (protoregistry.GlobalFiles, where generated code
	// registers its services): a streaming method, or a method that its
	// registered service does not have, is refused, since its calls would
	// pass through unprotected; a method of a service the registry does not
	// know (one served without generated code) is taken as written.
	Methods []string

	// Metadata lists the request metadata keys that may carry the key, in
	// lower case. Nil or empty means defaultMetadata ("idempotency-key").
	Metadata []string

	// RequestField is the name of a singular string field of the request
	// message that may carry the key instead (AIP-155's request_id), read
	// through protoreflect. A request whose message has no such field, or
	// leaves it empty, needs the key in its metadata. Empty means
	// defaultRequestField ("request_id").
	RequestField string

	// KeyPrefix starts every stored key; the interceptor adds a colon after
	// it, as the Watermill middleware does after its Config.KeyPrefix. It
	// must not hold a colon itself. Empty means defaultKeyPrefix
	// ("grpcidem").
	KeyPrefix string

	// KeyOptional lets calls without a key pass through without
	// idempotency. False (the default) answers them INVALID_ARGUMENT: a
	// payment API should not silently lose the protection because a client
	// forgot it.
	KeyOptional bool

	// Scope returns the scope of a call: the namespace part of its stored
	// key, as Config.Scope of package idempotency is for a message, so that
	// one key in two scopes is two keys. In gRPC it is derived per call,
	// from the call's context: the tenant that made it (the authenticated
	// peer or subject). Its SHA-256 is part of the stored key, so a client
	// can never receive the stored answer of another scope, two tenants may
	// use the same key, and no scope (an API key, say) appears in a key
	// name. The scope of a call is what Scope returns, the empty string
	// included: put authentication before this interceptor, so that an
	// anonymous call never reaches it. Required unless SingleTenant is set
	// (there is no safe default: one scope for every client would let a
	// client's key fetch another client's answer); New refuses a Config
	// with neither, or with both.
	Scope func(ctx context.Context) string

	// SingleTenant declares that every call belongs to one client (one
	// scope), so that no Scope is needed: a service called only by one
	// other service, say. Never set it for a public API: any client that
	// sends another client's key would get that client's stored answer.
	SingleTenant bool

	// LeaseTTL is how long a claim holds a key while the handler runs
	// (idempotency.OnceConfig.LeaseTTL): it is renewed every LeaseTTL/3,
	// and when the lease is lost the handler's context is cancelled with
	// idempotency.ErrLeaseLost as its cause. Zero means DefaultLeaseTTL
	// (40 s).
	LeaseTTL time.Duration

	// StoreTimeout bounds each store call; every call made while the key is
	// held is also bounded by what is left of the lease. Zero means
	// DefaultStoreTimeout (5 s).
	StoreTimeout time.Duration

	// CompletedTTL is how long a completed answer is kept and replayed.
	// Zero means DefaultCompletedTTL (24 h).
	CompletedTTL time.Duration

	// FailedTTL is how long a failed attempt is kept, with its fingerprint
	// and attempt count. Zero means DefaultFailedTTL (24 h).
	FailedTTL time.Duration

	// CacheTTL is how long, at most, a key this process saw completed is
	// replayed from memory, without a store call
	// (idempotency.OnceConfig.CacheTTL): never past the record's own
	// CompletedTTL, and an operator's Delete of the key reaches this
	// process only when the entry ends. Zero means DefaultCacheTTL
	// (idempotency.DefaultCacheTTL, 1 min).
	CacheTTL time.Duration

	// CacheMaxBytes bounds the memory of that cache (keys, stored answers,
	// fingerprints and a fixed overhead per entry). Zero means
	// idempotency.DefaultCacheMaxBytes (16 MiB).
	CacheMaxBytes int

	// DisableCache sends every claim to the store. An in-process store
	// (memstore) is never cached anyway.
	DisableCache bool

	// MaxResponseSize bounds the stored answer, in bytes: the response
	// message's wire bytes and type name, or the encoded final status with
	// its details. A larger answer still goes to the first caller in full,
	// and the key is completed without it: repeats are answered
	// ALREADY_EXISTS (ReasonResponseNotStored). Zero means
	// defaultMaxResponseSize (1 MiB).
	MaxResponseSize int

	// RetryAfter is the delay of the RetryInfo detail sent with ABORTED
	// (the key is in progress) and UNAVAILABLE (the store cannot be
	// reached); ABORTED also carries it as the trailer
	// grpc-retry-pushback-ms, which grpc-go's retry policy honours. Zero
	// means adapter.DefaultRetryAfter (1 s).
	RetryAfter time.Duration

	// FailOpen runs the handler without idempotency when the store cannot
	// be reached, and logs it. False (the default) fails closed:
	// UNAVAILABLE, the handler does not run, and the client retries later.
	FailOpen bool

	// Observer receives one outcome per call the interceptor applies to,
	// labelled with the call's full method name (never the scope or the
	// key), and the latency of every store call: the same
	// idempotency.Observer as the Watermill and HTTP middleware's, so
	// idemprom counts all three. Nil means none.
	Observer idempotency.Observer
}

func (c *Config) setDefaults() {
	shared := c.common().WithDefaults(defaultKeyPrefix)
	c.KeyPrefix, c.RetryAfter = shared.KeyPrefix, shared.RetryAfter
	c.LeaseTTL, c.StoreTimeout, c.CompletedTTL, c.FailedTTL = shared.LeaseTTL, shared.StoreTimeout, shared.CompletedTTL, shared.FailedTTL
	c.CacheTTL, c.CacheMaxBytes = shared.CacheTTL, shared.CacheMaxBytes
	c.Methods = slices.Clone(c.Methods)
	c.Metadata = slices.Clone(c.Metadata)
	if len(c.Metadata) == 0 {
		c.Metadata = []string{defaultMetadata}
	}
	c.RequestField = cmp.Or(c.RequestField, defaultRequestField)
	c.MaxResponseSize = cmp.Or(c.MaxResponseSize, defaultMaxResponseSize)
}

// common is what c shares, field for field, with the Config of package
// httpidem.
func (c Config) common() adapter.Common {
	return adapter.Common{Invalid: ErrInvalidConfig, NilStore: ErrNilStore, Unit: "call", Store: c.Store, Observer: c.Observer,
		Scoped: c.Scope != nil, SingleTenant: c.SingleTenant, KeyPrefix: c.KeyPrefix, RetryAfter: c.RetryAfter,
		LeaseTTL: c.LeaseTTL, StoreTimeout: c.StoreTimeout, CompletedTTL: c.CompletedTTL, FailedTTL: c.FailedTTL,
		CacheTTL: c.CacheTTL, CacheMaxBytes: c.CacheMaxBytes, DisableCache: c.DisableCache}
}

// Validate reports every problem of the config, not only the first:
// errors.Join of one error per problem, each matching ErrInvalidConfig (a
// missing Store matches ErrNilStore as well), in this fixed order: Store;
// Scope and SingleTenant (one of them, not both); LeaseTTL, StoreTimeout,
// CompletedTTL, FailedTTL, RetryAfter and CacheTTL (none negative, LeaseTTL
// at least 3 ms); MaxKeyLength and CacheMaxBytes (neither negative);
// Methods (required, each a full method name of a unary method, as far as
// the protobuf registry knows it); Metadata (each a usable
// metadata key); RequestField (a protobuf field name); MaxResponseSize (not negative). Zero fields other
// than Store, Methods, Scope and SingleTenant are valid: they stand for
// their defaults. New calls it after filling the defaults.
func (c Config) Validate() error {
	l := c.common().Check()
	if len(c.Methods) == 0 {
		l.Addf("Methods is required: the full names of the unary methods to make idempotent")
	}
	checkMethods(l, c.Methods)
	for _, name := range c.Metadata {
		checkMetadataName(l, name)
	}
	checkFieldName(l, c.RequestField)
	configerr.NotNegative(l, "MaxResponseSize", c.MaxResponseSize)
	return l.Err()
}

// checkMetadataName adds a problem to l unless name is a metadata key that
// can carry a printable key: lower-case letters, digits, '-', '_' and '.',
// not reserved by gRPC ("grpc-") and not binary ("-bin").
func checkMetadataName(l *configerr.List, name string) {
	if name == "" || strings.HasPrefix(name, "grpc-") || strings.HasSuffix(name, "-bin") {
		l.Addf("metadata key %q cannot carry a key (empty, reserved grpc- or binary -bin)", name)
		return
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			l.Addf("metadata key %q must be lower-case letters, digits, '-', '_' or '.'", name)
			return
		}
	}
}

// checkMethods adds a problem to l for each method that is not a full
// method name, and for each that the protobuf registry shows is not a
// unary method: a streaming one (no unary interceptor ever sees its
// calls), or one its service does not have (a misspelt name, whose calls
// would pass through). A method of a service that the registry does not
// know is taken as written.
func checkMethods(l *configerr.List, methods []string) {
	for _, m := range methods {
		if !isFullMethod(m) {
			l.Addf("method %q is not a full method name such as /payments.v1.Payments/CreatePayment", m)
			continue
		}
		md, known := lookupMethod(m)
		switch {
		case md != nil && (md.IsStreamingClient() || md.IsStreamingServer()):
			l.Addf("method %q streams: only unary methods can be made idempotent, and its calls would pass through unprotected", m)
		case md == nil && known:
			l.Addf("method %q is not a method of its service, as its registered descriptor has it", m)
		}
	}
}

// checkFieldName adds a problem to l unless field is empty (the default)
// or a protobuf field name.
func checkFieldName(l *configerr.List, field string) {
	if field != "" && !isFieldName(field) {
		l.Addf("RequestField %q is not a protobuf field name", field)
	}
}

// isFullMethod reports whether m reads "/service/method", the service
// possibly qualified by its package.
func isFullMethod(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return false
	}
	service, method, ok := strings.Cut(rest, "/")
	return ok && service != "" && method != "" && !strings.ContainsAny(method, "/ ") && !strings.ContainsAny(service, " ")
}

// isFieldName reports whether s is a protobuf identifier.
func isFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
