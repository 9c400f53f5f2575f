package grpcidem

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// ErrInvalidConfig is matched by every problem that [New] reports of a
// [Config], and that a [Client] with bad fields fails its calls with.
var ErrInvalidConfig = errors.New("grpcidem: invalid config")

// The defaults of the fields of Config and Client.
const (
	defaultMetadata     = "idempotency-key" // the HTTP header's gRPC spelling
	defaultRequestField = "request_id"      // as AIP-155 names it
	defaultKeyPrefix    = "grpcidem"        // not "idem" nor "httpidem"
)

// Config holds what the interceptor adds to its [idempotency.Once]: the
// store, the lease, the TTLs, FailOpen, the Observer and the stored-output
// bound (MaxOutputSize, for an answer) are the Once's. Methods, and Scope
// or SingleTenant, are required; every other field has a default.
type Config struct {
	// Methods are the full names of the unary methods to protect, as
	// "/payments.v1.Payments/CreatePayment". A streaming method, or one
	// its registered service lacks, is refused. Required.
	Methods []string

	// Scope returns the tenant of a call (the authenticated peer or
	// subject). Its hash is part of the stored key, so a client never gets
	// another tenant's answer. The empty string is a scope too: put
	// authentication first. Required, unless SingleTenant is set.
	Scope func(ctx context.Context) string

	// SingleTenant declares that one client calls this service, so no
	// Scope is needed. Never set it for a public API.
	SingleTenant bool

	// Metadata are the metadata keys that may carry the key, in lower
	// case. The default is "idempotency-key".
	Metadata []string

	// RequestField is a string field of the request that may carry the
	// key instead. The default is "request_id".
	RequestField string

	// KeyOptional lets a call without a key through, unprotected.
	// The default answers it INVALID_ARGUMENT.
	KeyOptional bool

	// KeyPrefix starts every stored key; it holds no colon.
	// The default is "grpcidem".
	KeyPrefix string

	// RetryAfter is the delay of the RetryInfo of ABORTED and UNAVAILABLE,
	// and of ABORTED's trailer grpc-retry-pushback-ms. The default is 1 s.
	RetryAfter time.Duration
}

// withDefaults returns c with its defaults applied, and every problem of
// it, each matching ErrInvalidConfig.
func (c Config) withDefaults() (Config, error) {
	l := configerr.New(ErrInvalidConfig)
	switch {
	case c.Scope == nil && !c.SingleTenant:
		l.Addf("Scope is required (the tenant of a call); set SingleTenant instead only when one client calls this service")
	case c.Scope != nil && c.SingleTenant:
		l.Addf("Scope and SingleTenant are both set; choose one")
	}
	configerr.NotNegative(l, "RetryAfter", c.RetryAfter)
	configerr.KeyPrefix(l, c.KeyPrefix)
	if len(c.Methods) == 0 {
		l.Addf("Methods is required: the full names of the unary methods to make idempotent")
	}
	checkMethods(l, c.Methods)
	for _, name := range c.Metadata {
		checkMetadataName(l, name)
	}
	checkFieldName(l, c.RequestField)
	c.Methods = slices.Clone(c.Methods)
	c.Metadata = slices.Clone(c.Metadata)
	if len(c.Metadata) == 0 {
		c.Metadata = []string{defaultMetadata}
	}
	c.RequestField = cmp.Or(c.RequestField, defaultRequestField)
	c.KeyPrefix = cmp.Or(c.KeyPrefix, defaultKeyPrefix)
	c.RetryAfter = cmp.Or(c.RetryAfter, adapter.DefaultRetryAfter)
	return c, l.Err()
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
