package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/idempotency/watermill-idempotency/examples/grpc/paymentspb"
	"github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpc example:", err)
		os.Exit(1)
	}
}

func run() error {
	logger := watermill.NewStdLogger(false, false)
	// The store is Redis at REDIS_URL, or in memory when it is unset.
	store, closeStore, err := openStore(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer closeStore()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
	if err != nil {
		return err
	}
	srv, err := newServer(once)
	if err != nil {
		return err
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger.Info("Payments service listening", watermill.LogFields{"addr": addr})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	srv.GracefulStop() // waits for running calls, so that their outcome gets recorded
	return nil
}

// newServer returns the Payments service behind bearer authentication, with
// CreatePayment idempotent and server reflection on, so that a stock client
// such as grpcurl can call it.
func newServer(once *idempotency.Once) (*grpc.Server, error) {
	// Scope is required: without it, a client sending another client's key
	// would get that client's stored payment. The API key is hashed in the
	// stored keys, so it never appears in Redis.
	idem, err := grpcidem.New(once, &grpcidem.Config{
		Methods: []string{paymentspb.Payments_CreatePayment_FullMethodName},
		Scope:   apiKey,
	})
	if err != nil {
		return nil, err
	}
	// The idempotency interceptor runs after authentication, so that its
	// scope is the authenticated API key. GetPayment passes through it
	// untouched, and so do the streams of the reflection service.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.UnaryServerInterceptor))
	paymentspb.RegisterPaymentsServer(srv, &payments{byID: map[string]owned{}})
	reflection.Register(srv)
	return srv, nil
}

// apiKey is the idempotency scope: the caller's API key, from the metadata
// "authorization: Bearer <api key>".
func apiKey(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if key, ok := strings.CutPrefix(v, "Bearer "); ok {
			return key
		}
	}
	return ""
}

func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if apiKey(ctx) == "" {
		return nil, status.Error(codes.Unauthenticated, "send the metadata authorization: Bearer <api key>")
	}
	return handler(ctx, req)
}

// payments stands for the bank: the side effect the service must not
// repeat.
type payments struct {
	paymentspb.UnimplementedPaymentsServer
	mu   sync.Mutex
	byID map[string]owned
}

// owned is a payment and the API key that made it.
type owned struct {
	owner   string
	payment *paymentspb.Payment
}

func (p *payments) CreatePayment(ctx context.Context, req *paymentspb.CreatePaymentRequest) (*paymentspb.Payment, error) {
	if req.Amount <= 0 || len(req.Currency) != 3 {
		// Not retryable: the interceptor stores this answer and replays it.
		return nil, status.Error(codes.InvalidArgument, "send a positive amount in minor units and a 3-letter currency")
	}
	// The payment id derives from the caller and its key, as a bank's own
	// idempotency reference would: even a rerun after a crash names the
	// same payment.
	key := req.RequestId
	if key == "" {
		md, _ := metadata.FromIncomingContext(ctx)
		key = strings.Join(md.Get("idempotency-key"), "")
	}
	sum := sha256.Sum256([]byte(apiKey(ctx) + "\x00" + key))
	pay := &paymentspb.Payment{Id: "pay_" + hex.EncodeToString(sum[:6]), Amount: req.Amount,
		Currency: strings.ToLower(req.Currency), Status: "succeeded"}
	p.mu.Lock()
	p.byID[pay.Id] = owned{owner: apiKey(ctx), payment: pay}
	p.mu.Unlock()
	return pay, nil
}

func (p *payments) GetPayment(ctx context.Context, req *paymentspb.GetPaymentRequest) (*paymentspb.Payment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.byID[req.Id]
	if !ok || o.owner != apiKey(ctx) {
		return nil, status.Errorf(codes.NotFound, "no payment %q", req.Id)
	}
	return o.payment, nil
}

// openStore returns the Redis store at redisURL (redis://host:port/db), or,
// when redisURL is empty, an in-memory store: one process only, fine for a
// demo, never for production. closeStore releases what the store holds.
func openStore(redisURL string) (store idempotency.Store, closeStore func(), err error) {
	if redisURL == "" {
		s := memstore.New(nil)
		return s, func() {}, nil
	}
	// NewFromURL sets ContextTimeoutEnabled, which a URL cannot say and
	// the store requires.
	s, client, err := redisstore.NewFromURL(redisURL, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	return s, func() { _ = client.Close() }, nil
}
