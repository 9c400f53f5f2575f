package grpcidem

import (
	"cmp"
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// Client gives each logical unary call one idempotency key, which
// grpc-go's retries resend. Its zero value is ready to use. A call keeps
// a key it carries: from [WithKey], its outgoing metadata or its request's
// request_id. A Client is safe for concurrent use; its fields must not
// change after its first call.
type Client struct {
	// Metadata carries the key; it must be one of the server's
	// [Config].Metadata. The default is "idempotency-key".
	Metadata string

	init     sync.Once
	err      error
	metadata string // Metadata, or its default
}

func (c *Client) setup() error {
	c.init.Do(func() {
		c.metadata = cmp.Or(c.Metadata, defaultMetadata)
		l := configerr.New(ErrInvalidConfig)
		checkMetadataName(l, c.metadata)
		c.err = l.Err()
	})
	return c.err
}

// UnaryClientInterceptor is the [grpc.UnaryClientInterceptor]. A [WithKey]
// key that differs from the call's own metadata is refused with
// INVALID_ARGUMENT before it is sent, as the server would refuse it. A
// Client with bad fields fails every call.
func (c *Client) UnaryClientInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if err := c.setup(); err != nil {
		return err
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	sent := md.Get(c.metadata)
	if key, ok := ctx.Value(keyContext{}).(string); ok {
		if c.metadata != defaultMetadata {
			if v := md.Get(defaultMetadata); len(v) == 1 && v[0] == key {
				md.Delete(defaultMetadata)
				ctx = metadata.NewOutgoingContext(ctx, md)
			}
		}
		switch {
		case len(sent) == 0:
			ctx = metadata.AppendToOutgoingContext(ctx, c.metadata, key)
		case len(sent) > 1 || sent[0] != key:
			return status.Errorf(codes.InvalidArgument,
				"grpcidem: the call's key from WithKey differs from its outgoing metadata %s", c.metadata)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if len(sent) > 0 {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if m, ok := req.(proto.Message); ok {
		if v, ok := fieldKey(m, defaultRequestField); ok && v != "" {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
	}
	ctx = metadata.AppendToOutgoingContext(ctx, c.metadata, watermill.NewUUID())
	return invoker(ctx, method, req, reply, cc, opts...)
}

// WithKey returns ctx carrying key, for an application that retries a
// call itself: every attempt with it sends key. A [Client] sends it under
// its own Metadata; without one it goes under "idempotency-key", unless
// the outgoing metadata already holds a value there. The last WithKey of
// a context wins.
func WithKey(ctx context.Context, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	prev, hadPrev := ctx.Value(keyContext{}).(string)
	if v := md.Get(defaultMetadata); len(v) == 0 || hadPrev && len(v) == 1 && v[0] == prev {
		if md == nil {
			md = metadata.MD{}
		}
		md.Set(defaultMetadata, key)
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	return context.WithValue(ctx, keyContext{}, key)
}

type keyContext struct{}
