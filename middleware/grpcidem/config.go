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

// ErrInvalidConfig is matched by every problem of a [Config] or [Client].
var ErrInvalidConfig = errors.New("grpcidem: invalid config")

const (
	defaultMetadata     = "idempotency-key"
	defaultRequestField = "request_id" // the key's field, as AIP-155 names it
	defaultKeyPrefix    = "grpcidem"
)

// Config is what the interceptor adds to its [idempotency.Once].
// Methods, and Scope or SingleTenant, are required.
type Config struct {
	// Methods are the full names of the unary methods to protect, as
	// "/payments.v1.Payments/CreatePayment". Required.
	Methods []string

	// Scope returns the tenant of a call, as the authenticated subject.
	// Its hash is part of the stored key. Required, unless SingleTenant.
	Scope func(ctx context.Context) string

	// SingleTenant says one client calls this service, so no Scope is needed.
	SingleTenant bool

	// Metadata are the metadata keys that may carry the key, in lower
	// case. The default is "idempotency-key".
	Metadata []string

	// KeyOptional lets a call without a key through, unprotected.
	KeyOptional bool

	// KeyPrefix starts every stored key. The default is "grpcidem".
	KeyPrefix string

	// RetryAfter is the delay of the RetryInfo of ABORTED and UNAVAILABLE,
	// and of ABORTED's grpc-retry-pushback-ms. The default is 1 s.
	RetryAfter time.Duration
}

func (c Config) withDefaults() (Config, error) {
	l := configerr.New(ErrInvalidConfig)
	adapter.CheckCommon(l, "call", c.Scope != nil, c.SingleTenant, c.RetryAfter, c.KeyPrefix)
	if len(c.Methods) == 0 {
		l.Addf("Methods is required: the full names of the unary methods to make idempotent")
	}
	checkMethods(l, c.Methods)
	for _, name := range c.Metadata {
		checkMetadataName(l, name)
	}
	c.Methods = slices.Clone(c.Methods)
	c.Metadata = slices.Clone(c.Metadata)
	if len(c.Metadata) == 0 {
		c.Metadata = []string{defaultMetadata}
	}
	c.KeyPrefix = cmp.Or(c.KeyPrefix, defaultKeyPrefix)
	c.RetryAfter = cmp.Or(c.RetryAfter, adapter.DefaultRetryAfter)
	return c, l.Err()
}

// checkMetadataName adds a problem unless name can carry a printable key.
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

// checkMethods adds a problem for each method that is not a full method
// name, or that the protobuf registry shows streams or does not have. A
// method of a service the registry does not know is taken as written.
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

// isFullMethod reports whether m reads "/package.Service/Method".
func isFullMethod(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return false
	}
	service, method, ok := strings.Cut(rest, "/")
	return ok && service != "" && method != "" && !strings.ContainsAny(method, "/ ") && !strings.ContainsAny(service, " ")
}
