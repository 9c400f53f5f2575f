package grpcidem

import (
	"context"
	"crypto/rand"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// ClientConfig configures a Client. The zero ClientConfig is valid: every
// field has a usable zero value, documented on the field.
type ClientConfig struct {
	// Metadata is the metadata key the key is sent in, in lower case. Empty
	// means DefaultMetadata ("idempotency-key"). It must be one of the
	// server's Config.Metadata.
	Metadata string

	// RequestField names the request message's string field that carries
	// the key, as on the server (Config.RequestField). A request that sets
	// it carries its own key: the Client adds none. Empty means
	// DefaultRequestField ("request_id").
	RequestField string

	// Methods lists the full names of the unary methods that get a key.
	// Nil or empty means every unary method: a server ignores a key it
	// does not use.
	Methods []string

	// NewKey returns a fresh key for one logical call. Nil means a random
	// version 4 UUID.
	NewKey func() string
}

// Client gives each logical unary call an idempotency key. Install Unary as
// a grpc.UnaryClientInterceptor:
//
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(client.Unary), ...)
//
// A call whose outgoing metadata already carries the key (WithKey), or whose
// request message sets Config.RequestField, keeps it; any other call gets a
// fresh key. grpc-go's retry policy (a service config's retryPolicy) and
// transparent retries resend the call below the interceptor, with the same
// metadata, so every attempt of one call carries one key; an application
// that retries a call itself passes the same key with WithKey, or the same
// request_id in the message.
type Client struct {
	cfg     ClientConfig
	methods map[string]bool
}

// NewClient returns a Client for cfg, which is copied. It reports every
// problem of cfg, joined with errors.Join, each matching ErrInvalidConfig,
// in this fixed order: Metadata (a usable metadata key), RequestField (a
// protobuf field name), Methods (each a full method name).
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

// Unary is the grpc.UnaryClientInterceptor.
func (c *Client) Unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if c.methods != nil && !c.methods[method] {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(c.cfg.Metadata)) > 0 {
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

// WithKey returns ctx carrying key in the metadata DefaultMetadata, for an
// application that retries a logical call itself: every attempt made with
// the returned context carries the same key, and a Client leaves it as it
// is.
func WithKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, DefaultMetadata, key)
}

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
