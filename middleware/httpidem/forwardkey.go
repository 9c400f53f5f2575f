package httpidem

import (
	"context"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

type forwardKeyCtx struct{}

// ForwardKey returns the key a handler hands on with its work, as the
// requestId of a message it publishes: the scope's hash, a colon and the
// key, unquoted. The scope never appears. ok is false outside a handler
// the [Middleware] protects (also under FailOpen).
func ForwardKey(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(forwardKeyCtx{}).(string)
	return key, ok
}

func withForwardKey(ctx context.Context, prefix, skey string) context.Context {
	return context.WithValue(ctx, forwardKeyCtx{}, adapter.ForwardKey(prefix, skey))
}
