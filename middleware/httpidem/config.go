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

// The defaults of the fields of Config and Transport.
const (
	defaultHeader          = "Idempotency-Key" // the IETF draft's name
	defaultKeyPrefix       = "httpidem"        // not the Watermill middleware's "idem"
	defaultMaxRequestBody  = 10 << 20
	defaultProblemTypeBase = "https://github.com/idempotency/watermill-idempotency/blob/main/docs/GUARANTEES.md#"
	defaultOutcomeLabel    = "http" // the Observer's label without a ServeMux pattern
)

// ErrInvalidConfig is matched by every problem that [New] reports of a
// [Config], and that a [Transport] with bad fields fails its calls with.
var ErrInvalidConfig = errors.New("httpidem: invalid config")

// Config holds what the middleware adds to its [idempotency.Once]: the
// store, the lease, the TTLs, FailOpen, the Observer and the stored-output
// bound (MaxOutputSize, for a response body) are the Once's. Scope or
// SingleTenant is required; every other field has a default.
type Config struct {
	// Scope returns the tenant of a request (an authenticated subject, an
	// API key's id). Its hash is part of the stored key, so a client never
	// gets another tenant's response. The empty string is a scope too: put
	// authentication first. Required, unless SingleTenant is set.
	Scope func(r *http.Request) string

	// SingleTenant declares that one client calls this service, so no
	// Scope is needed. Never set it for a public API.
	SingleTenant bool

	// Methods are the methods the middleware applies to; others pass
	// through. The default is POST and PATCH.
	Methods []string

	// Header carries the key. The default is "Idempotency-Key".
	Header string

	// KeyOptional lets a request without a key through, unprotected.
	// The default answers it 400.
	KeyOptional bool

	// KeyPrefix starts every stored key; it holds no colon.
	// The default is "httpidem".
	KeyPrefix string

	// MaxRequestBody bounds the body read to fingerprint the request.
	// A larger one is answered 413. The default is 10 MiB.
	MaxRequestBody int64

	// RetryAfter is the Retry-After of 409 and 503, in whole seconds.
	// The default is 1 s.
	RetryAfter time.Duration

	// ProblemTypeBase starts the type of every problem; the outcome's
	// name follows. The default is the URL of docs/GUARANTEES.md.
	ProblemTypeBase string
}

// withDefaults returns c with its defaults applied, and every problem of
// it, each matching ErrInvalidConfig.
func (c Config) withDefaults() (Config, error) {
	l := configerr.New(ErrInvalidConfig)
	switch {
	case c.Scope == nil && !c.SingleTenant:
		l.Addf("Scope is required (the tenant of a request); set SingleTenant instead only when one client calls this service")
	case c.Scope != nil && c.SingleTenant:
		l.Addf("Scope and SingleTenant are both set; choose one")
	}
	configerr.NotNegative(l, "RetryAfter", c.RetryAfter)
	configerr.KeyPrefix(l, c.KeyPrefix)
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
	c.MaxRequestBody = cmp.Or(c.MaxRequestBody, defaultMaxRequestBody)
	c.RetryAfter = cmp.Or(c.RetryAfter, adapter.DefaultRetryAfter)
	c.ProblemTypeBase = cmp.Or(c.ProblemTypeBase, defaultProblemTypeBase)
	return c, l.Err()
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
