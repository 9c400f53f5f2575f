package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware"
)

// Defaults used for the zero value of the corresponding Config fields.
const (
	// DefaultMetadata is the request metadata key carrying the idempotency
	// key: the gRPC spelling of the HTTP Idempotency-Key header.
	DefaultMetadata = "idempotency-key"
	// DefaultRequestField is the request message's string field carrying
	// the key, as Google's AIP-155 names it.
	DefaultRequestField = "request_id"
	// DefaultKeyPrefix starts every stored key. It differs from the
	// prefixes of the Watermill and HTTP middleware, so that keys of the
	// three sharing one store never meet.
	DefaultKeyPrefix = "grpcidem:"
	// DefaultMaxKeyLength is the longest key accepted, in bytes, as in
	// package httpidem.
	DefaultMaxKeyLength = 255
	// DefaultLease is how long a claim holds a key while the handler runs;
	// it is renewed every third of it (middleware.DefaultLeaseTTL).
	DefaultLease = middleware.DefaultLeaseTTL
	// DefaultCompletedTTL is how long a completed answer is replayed.
	DefaultCompletedTTL = 24 * time.Hour
	// DefaultFailedTTL is how long a failed attempt is remembered (its
	// fingerprint still binds the key; a retry may run again).
	DefaultFailedTTL = 24 * time.Hour
	// DefaultMaxResponseSize bounds the stored answer: the response's wire
	// bytes and type name, or the final status with its details.
	DefaultMaxResponseSize = 1 << 20
	// DefaultStoreTimeout bounds each store call
	// (middleware.DefaultStoreTimeout).
	DefaultStoreTimeout = middleware.DefaultStoreTimeout
	// DefaultRetryAfter is the delay of the RetryInfo sent with ABORTED
	// (the key is in progress) and UNAVAILABLE (the store is down).
	DefaultRetryAfter = time.Second
)

// ErrNilStore is returned by New for a Config without a Store.
var ErrNilStore = errors.New("grpcidem: nil store")

// ErrInvalidConfig is returned by New and NewClient, wrapped with the
// reason, for a Config without Methods, a malformed method or metadata
// name, a negative duration or size, or a Config that sets neither Scope nor
// SingleTenant, or both.
var ErrInvalidConfig = errors.New("grpcidem: invalid config")

// Config configures an Interceptor. Store, Methods and the choice between
// Scope and SingleTenant are required; every other field has a usable zero
// value, documented on the field.
type Config struct {
	// Store keeps the state of every key. Required: there is no silent
	// default (use memstore for tests and demos, redisstore in production).
	Store middleware.Store

	// Methods lists the full names of the unary methods the interceptor
	// applies to, as grpc.UnaryServerInfo.FullMethod spells them
	// ("/payments.v1.Payments/CreatePayment"). Calls of any other method
	// pass through untouched. Required: gRPC has no verb that says which
	// calls have effects, so the service says it.
	Methods []string

	// Metadata lists the request metadata keys that may carry the key, in
	// lower case. Nil or empty means DefaultMetadata ("idempotency-key").
	Metadata []string

	// RequestField is the name of a singular string field of the request
	// message that may carry the key instead (AIP-155's request_id), read
	// through protoreflect. A request whose message has no such field, or
	// leaves it empty, needs the key in its metadata. Empty means
	// DefaultRequestField ("request_id").
	RequestField string

	// KeyOptional lets calls without a key pass through without
	// idempotency. False (the default) answers them INVALID_ARGUMENT: a
	// payment API should not silently lose the protection because a client
	// forgot it.
	KeyOptional bool

	// MaxKeyLength is the longest key accepted, in bytes. Zero means
	// DefaultMaxKeyLength (255); longer keys are answered INVALID_ARGUMENT.
	MaxKeyLength int

	// Scope returns the tenant a call belongs to (the authenticated peer or
	// subject), from the call's context. Its SHA-256 is part of the stored
	// key, so a client can never receive the stored answer of another
	// scope, two tenants may use the same key, and no scope (an API key,
	// say) appears in a key name. The scope of a call is what Scope
	// returns, the empty string included: put authentication before this
	// interceptor, so that an anonymous call never reaches it. Required
	// unless SingleTenant is set; New refuses a Config with neither, or
	// with both.
	Scope func(ctx context.Context) string

	// SingleTenant declares that every call belongs to one client (one
	// scope), so that no Scope is needed: a service called only by one
	// other service, say. Never set it for a public API: any client that
	// sends another client's key would get that client's stored answer.
	SingleTenant bool

	// KeyPrefix starts every stored key. Empty means DefaultKeyPrefix.
	KeyPrefix string

	// Lease is how long a claim holds a key while the handler runs
	// (middleware.OnceConfig.LeaseTTL): it is renewed every Lease/3, and
	// when the lease is lost the handler's context is cancelled with
	// middleware.ErrLeaseLost as its cause. Zero means DefaultLease (40 s).
	Lease time.Duration

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

	// MaxResponseSize bounds the stored answer, in bytes: the response
	// message's wire bytes and type name, or the encoded final status with
	// its details. A larger answer still goes to the first caller in full,
	// and the key is completed without it: repeats are answered
	// ALREADY_EXISTS (ReasonResponseNotStored). Zero means
	// DefaultMaxResponseSize (1 MiB).
	MaxResponseSize int

	// RetryAfter is the delay of the RetryInfo detail sent with ABORTED
	// (the key is in progress) and UNAVAILABLE (the store cannot be
	// reached); ABORTED also carries it as the trailer
	// grpc-retry-pushback-ms, which grpc-go's retry policy honours. Zero
	// means DefaultRetryAfter (1 s).
	RetryAfter time.Duration

	// FailOpen runs the handler without idempotency when the store cannot
	// be reached, and logs it. False (the default) fails closed:
	// UNAVAILABLE, the handler does not run, and the client retries later.
	FailOpen bool

	// Observer receives one outcome per call the interceptor applies to,
	// labelled with the call's full method name (never the scope or the
	// key), and the latency of every store call: the same
	// middleware.Observer as the Watermill and HTTP middleware's, so
	// idemprom counts all three. Nil means none.
	Observer middleware.Observer
}

func (c *Config) setDefaults() {
	c.Methods = append([]string(nil), c.Methods...)
	if len(c.Metadata) == 0 {
		c.Metadata = []string{DefaultMetadata}
	} else {
		c.Metadata = append([]string(nil), c.Metadata...)
	}
	if c.RequestField == "" {
		c.RequestField = DefaultRequestField
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = DefaultMaxKeyLength
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.CompletedTTL == 0 {
		c.CompletedTTL = DefaultCompletedTTL
	}
	if c.FailedTTL == 0 {
		c.FailedTTL = DefaultFailedTTL
	}
	if c.MaxResponseSize == 0 {
		c.MaxResponseSize = DefaultMaxResponseSize
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
}

// Validate reports whether the config can be used. Zero fields other than
// Store, Methods, Scope and SingleTenant are valid: they stand for their
// defaults. New calls it after filling the defaults.
func (c Config) Validate() error {
	if c.Store == nil {
		return ErrNilStore
	}
	switch {
	case c.Scope == nil && !c.SingleTenant:
		return fmt.Errorf("%w: Scope is required (the tenant of a call); set SingleTenant instead only when one client calls this service", ErrInvalidConfig)
	case c.Scope != nil && c.SingleTenant:
		return fmt.Errorf("%w: Scope and SingleTenant are both set; choose one", ErrInvalidConfig)
	}
	if len(c.Methods) == 0 {
		return fmt.Errorf("%w: Methods is required: the full names of the unary methods to make idempotent", ErrInvalidConfig)
	}
	for _, m := range c.Methods {
		if !isFullMethod(m) {
			return fmt.Errorf("%w: method %q is not a full method name such as /payments.v1.Payments/CreatePayment", ErrInvalidConfig, m)
		}
	}
	for _, name := range c.Metadata {
		if err := checkMetadataName(name); err != nil {
			return err
		}
	}
	if !isFieldName(c.RequestField) {
		return fmt.Errorf("%w: RequestField %q is not a protobuf field name", ErrInvalidConfig, c.RequestField)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Lease", c.Lease}, {"StoreTimeout", c.StoreTimeout}, {"CompletedTTL", c.CompletedTTL}, {"FailedTTL", c.FailedTTL}, {"RetryAfter", c.RetryAfter}} {
		if f.d < 0 {
			return fmt.Errorf("%w: %s is %v, must not be negative", ErrInvalidConfig, f.name, f.d)
		}
	}
	if c.Lease > 0 && c.Lease < 3*time.Millisecond {
		return fmt.Errorf("%w: Lease %v is too short to renew every Lease/3", ErrInvalidConfig, c.Lease)
	}
	if c.MaxKeyLength < 0 {
		return fmt.Errorf("%w: MaxKeyLength is %d", ErrInvalidConfig, c.MaxKeyLength)
	}
	if c.MaxResponseSize < 0 {
		return fmt.Errorf("%w: MaxResponseSize is %d", ErrInvalidConfig, c.MaxResponseSize)
	}
	return nil
}

// checkMetadataName accepts a metadata key that can carry a printable key:
// lower-case letters, digits, '-', '_' and '.', not reserved by gRPC
// ("grpc-") and not binary ("-bin").
func checkMetadataName(name string) error {
	if name == "" || strings.HasPrefix(name, "grpc-") || strings.HasSuffix(name, "-bin") {
		return fmt.Errorf("%w: metadata key %q cannot carry a key (empty, reserved grpc- or binary -bin)", ErrInvalidConfig, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: metadata key %q must be lower-case letters, digits, '-', '_' or '.'", ErrInvalidConfig, name)
		}
	}
	return nil
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
