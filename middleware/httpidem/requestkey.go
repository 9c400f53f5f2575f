package httpidem

import (
	"context"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// requestKeyCtx is the context key of the request's parsed key.
type requestKeyCtx struct{}

// requestKeys is what the Middleware read from one request's key header.
type requestKeys struct {
	key     string // the parsed key: an sf-string unquoted
	forward string // the scope's hash, a colon and the key
}

// RequestKey returns the key of the request being served, as parsed: a
// quoted key without its quotes, so both forms of one key give one value.
// It is in the context the [Middleware] hands the handler, also under
// FailOpen. ok is false elsewhere: for a method not in Methods, or a request
// without a key under KeyOptional. [WithKey] is the client side.
func RequestKey(ctx context.Context) (key string, ok bool) {
	k, ok := ctx.Value(requestKeyCtx{}).(requestKeys)
	return k.key, ok
}

// ForwardKey returns the key a handler hands on with its work, as the
// requestId of a message it publishes, say: the scope's hash, a colon and
// [RequestKey]. Two spellings of one key forward one value; two tenants'
// same key forward two; the scope itself never appears. ok is as
// RequestKey's.
func ForwardKey(ctx context.Context) (key string, ok bool) {
	k, ok := ctx.Value(requestKeyCtx{}).(requestKeys)
	return k.forward, ok
}

// withRequestKey returns ctx carrying the parsed key and the forward key,
// cut from the stored key skey (prefix, a colon, then the forward key).
func withRequestKey(ctx context.Context, prefix, key, skey string) context.Context {
	return context.WithValue(ctx, requestKeyCtx{}, requestKeys{key: key, forward: adapter.ForwardKey(prefix, skey)})
}
