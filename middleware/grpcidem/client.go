package grpcidem

import (
	"context"
	"crypto/rand"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// ClientConfig configures a Client. The zero ClientConfig is valid: every
// field has a usable zero value, documented on the field.
type ClientConfig struct {
	// Metadata is the metadata key the key is sent in, in lower case. Empty
	// means DefaultMetadata ("idempotency-key"). It must be one of the
	// server's Config.Metadata. A key set with WithKey is sent under it
	// too.
	Metadata string

	// RequestField names the request message's string field that carries
	// the key, as on the server (Config.RequestField). A request that sets
	// it carries its own key: the Client adds none. Empty means
	// DefaultRequestField ("request_id").
	RequestField string

	// Methods lists the full names of the unary methods that get a fresh
	// key. Nil or empty means every unary method: a server ignores a key
	// it does not use. A key set with WithKey is sent for any method. As in
	// Config.Methods, a streaming method, or one that its registered
	// service does not have, is refused.
	Methods []string

	// NewKey returns a fresh key for one logical call. Nil means a random
	// version 4 UUID.
	NewKey func() string
}

// Client gives each logical unary call an idempotency key. Install
// UnaryClientInterceptor, which is a grpc.UnaryClientInterceptor:
//
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor), ...)
//
// A call made with a context from WithKey is sent with that key under
// ClientConfig.Metadata; a call whose outgoing metadata already carries
// that name, or whose request message sets ClientConfig.RequestField, keeps
// its key; any other call gets a fresh key. grpc-go's retry policy (a
// service config's retryPolicy) and transparent retries resend the call
// below the interceptor, with the same metadata, so every attempt of one
// call carries one key; an application that retries a call itself passes
// the same key with WithKey, or the same request_id in the message.
type Client struct {
	cfg     ClientConfig
	methods map[string]bool
}

// NewClient returns a Client for cfg, which is copied. It reports every
// problem of cfg, joined with errors.Join, each matching ErrInvalidConfig,
// in this fixed order: Metadata (a usable metadata key), RequestField (a
// protobuf field name), Methods (each a full method name of a unary
// method, as far as the protobuf registry knows it).
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Metadata == "" {
		cfg.Metadata = DefaultMetadata
	}
	if cfg.RequestField == "" {
		cfg.RequestField = DefaultRequestField
	}
	if cfg.NewKey == nil {
		cfg.NewKey = newUUID
	}
	l := configerr.New(ErrInvalidConfig)
	checkMetadataName(l, cfg.Metadata)
	checkFieldName(l, cfg.RequestField)
	checkMethods(l, cfg.Methods)
	if err := l.Err(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg}
	if len(cfg.Methods) > 0 {
		c.methods = map[string]bool{}
		for _, m := range cfg.Methods {
			c.methods[m] = true
		}
	}
	c.cfg.Methods = nil
	return c, nil
}

// UnaryClientInterceptor is the grpc.UnaryClientInterceptor. A call whose
// WithKey key differs from a value the application put in the outgoing
// metadata under ClientConfig.Metadata itself is refused with
// INVALID_ARGUMENT before it is sent: the server would refuse it as well.
// A WithKey key is sent under ClientConfig.Metadata alone: when that is not
// DefaultMetadata, the copy WithKey put there for connections without a
// Client is taken out.
func (c *Client) UnaryClientInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	sent := md.Get(c.cfg.Metadata)
	if key, ok := ctx.Value(keyContext{}).(string); ok {
		if c.cfg.Metadata != DefaultMetadata {
			if v := md.Get(DefaultMetadata); len(v) == 1 && v[0] == key {
				md.Delete(DefaultMetadata)
				ctx = metadata.NewOutgoingContext(ctx, md)
			}
		}
		switch {
		case len(sent) == 0:
			ctx = metadata.AppendToOutgoingContext(ctx, c.cfg.Metadata, key)
		case len(sent) > 1 || sent[0] != key:
			return status.Errorf(codes.InvalidArgument,
				"grpcidem: the call's key from WithKey differs from its outgoing metadata %s", c.cfg.Metadata)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if c.methods != nil && !c.methods[method] {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if len(sent) > 0 {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if m, ok := req.(proto.Message); ok {
		if v, ok := fieldKey(m, c.cfg.RequestField); ok && v != "" {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
	}
	ctx = metadata.AppendToOutgoingContext(ctx, c.cfg.Metadata, c.cfg.NewKey())
	return invoker(ctx, method, req, reply, cc, opts...)
}

// WithKey returns ctx carrying key as the idempotency key of the logical
// call made with it, for an application that retries a call itself: every
// attempt made with the returned context carries the same key. A Client's
// interceptor (Client.UnaryClientInterceptor) sends it under the Client's own
// ClientConfig.Metadata, so the name the key is sent under is always the
// one the Client and the server were configured with. A connection without
// a Client's interceptor sends it under DefaultMetadata, where WithKey
// also puts it unless the application put a value of its own there (a
// Client then refuses the call when the two differ). The last WithKey of a
// context wins.
func WithKey(ctx context.Context, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	prev, hadPrev := ctx.Value(keyContext{}).(string)
	if v := md.Get(DefaultMetadata); len(v) == 0 || hadPrev && len(v) == 1 && v[0] == prev {
		if md == nil {
			md = metadata.MD{}
		}
		md.Set(DefaultMetadata, key)
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	return context.WithValue(ctx, keyContext{}, key)
}

// keyContext is the context key of WithKey's key.
type keyContext struct{}

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
