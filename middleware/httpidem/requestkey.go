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

// RequestKey returns the idempotency key of the request being served, as
// the Middleware parsed it from the key header: a quoted key (the IETF
// draft's form, "8e03978e") without its quotes and escapes, so that both
// forms of one key give one value. It is set in the context of every
// request whose key the Middleware accepted and that it passes to the
// wrapped handler (r.Context() there): as the key's owner, or with
// FailOpen while the store is down. ok is false elsewhere, for example
// when KeyOptional let a request without a key through, or for a method
// not in Methods.
//
// RequestKey is the server side; WithKey and KeyFromContext are the
// client side, the key a Transport sends.
func RequestKey(ctx context.Context) (key string, ok bool) {
	k, ok := ctx.Value(requestKeyCtx{}).(requestKeys)
	return k.key, ok
}

// ForwardKey returns the key a handler forwards when it hands its work on,
// for example as the requestId metadata of a message it publishes: the hex
// of the first 16 bytes of SHA-256 of the request's scope, a colon, and
// the parsed key (RequestKey). A key sent quoted and bare forwards as one
// value, so that the consumer runs its effect once; two tenants that send
// the same key forward two values, so that they never collide at the
// consumer; and the scope itself (an API key, say) is never in it. ok is
// false where RequestKey's is.
func ForwardKey(ctx context.Context) (key string, ok bool) {
	k, ok := ctx.Value(requestKeyCtx{}).(requestKeys)
	return k.forward, ok
}

// withRequestKey returns ctx carrying the parsed key and the forward key,
// cut from the stored key skey (prefix, a colon, then the forward key).
func withRequestKey(ctx context.Context, prefix, key, skey string) context.Context {
	return context.WithValue(ctx, requestKeyCtx{}, requestKeys{key: key, forward: adapter.ForwardKey(prefix, skey)})
}
