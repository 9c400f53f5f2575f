package httpidem

import (
	"cmp"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

const (
	defaultHeader       = "Idempotency-Key"
	defaultKeyPrefix    = "httpidem"
	problemTypeBase     = "https://github.com/idempotency/watermill-idempotency/blob/main/docs/GUARANTEES.md#"
	defaultOutcomeLabel = "http" // the Observer's label without a ServeMux pattern
)

// ErrInvalidConfig is matched by every problem of a [Config] or [Transport].
var ErrInvalidConfig = errors.New("httpidem: invalid config")

// Config is what the middleware adds to its [idempotency.Once].
// Scope or SingleTenant is required.
type Config struct {
	// Scope returns the tenant of a request, as an API key's id.
	// Its hash is part of the stored key. Required, unless SingleTenant.
	Scope func(r *http.Request) string

	// SingleTenant says one client calls this service, so no Scope is needed.
	SingleTenant bool

	// Methods are the methods protected. The default is POST and PATCH.
	Methods []string

	// Header carries the key. The default is "Idempotency-Key".
	Header string

	// KeyOptional lets a request without a key through, unprotected.
	KeyOptional bool

	// KeyPrefix starts every stored key. The default is "httpidem".
	KeyPrefix string

	// MaxRequestBody bounds the body; a larger one is answered 413.
	// The default is 10 MiB.
	MaxRequestBody int64

	// RetryAfter is the Retry-After of 409 and 503. The default is 1 s.
	RetryAfter time.Duration
}

func (c Config) withDefaults() (Config, error) {
	l := configerr.New(ErrInvalidConfig)
	adapter.CheckCommon(l, "request", c.Scope != nil, c.SingleTenant, c.RetryAfter, c.KeyPrefix)
	configerr.NotNegative(l, "MaxRequestBody", c.MaxRequestBody)
	if c.Header != "" && !isToken(c.Header) {
		l.Addf("Header %q is not a header name", c.Header)
	}
	for _, m := range c.Methods {
		if !isToken(m) {
			l.Addf("method %q is not a method name", m)
		}
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		c.Methods = slices.Clone(c.Methods)
	}
	c.Header = http.CanonicalHeaderKey(cmp.Or(c.Header, defaultHeader))
	c.KeyPrefix = cmp.Or(c.KeyPrefix, defaultKeyPrefix)
	c.MaxRequestBody = cmp.Or(c.MaxRequestBody, 10<<20)
	c.RetryAfter = cmp.Or(c.RetryAfter, adapter.DefaultRetryAfter)
	return c, l.Err()
}

// isToken reports whether s is an RFC 9110 token.
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
