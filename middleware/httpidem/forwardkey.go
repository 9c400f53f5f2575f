package httpidem

import (
	"context"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter/serve"
)

// ForwardKey returns the key a handler hands on with its work, as the
// requestId of a message it publishes: the scope's hash, a colon and the
// key, unquoted. The scope never appears. ok is false outside a handler
// the [Middleware] protects (also under FailOpen).
func ForwardKey(ctx context.Context) (key string, ok bool) { return serve.ForwardKey(ctx) }
