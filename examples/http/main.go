package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// paymentsTopic carries one event per payment, to the receipts consumer.
const paymentsTopic = "payments.succeeded"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "http example:", err)
		os.Exit(1)
	}
}

func run() error {
	logger := watermill.NewStdLogger(false, false)
	// The store is Redis at REDIS_URL, or in memory when it is unset (one
	// process only: fine for a demo, never for production).
	store, closeStore, err := openStore(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	defer closeStore()

	// The broker: in-process Go channels here; see examples/broker-switch
	// for Kafka, Redis Streams, AMQP or NATS from one BROKER_URL.
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	// One Once per process: the API and the consumer share its store,
	// settings and cache.
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
	if err != nil {
		return err
	}
	r := newReceipts()
	router, err := newConsumer(once, pubSub, r, logger)
	if err != nil {
		return err
	}
	api, err := newAPI(once, pubSub)
	if err != nil {
		return err
	}

	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 2)
	go func() { errc <- router.Run(ctx) }()
	<-router.Running()
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("Payments API listening", watermill.LogFields{"addr": addr})

	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	// Shutdown order: the HTTP server first, which waits for the requests
	// in flight, so that their outcome gets recorded and their events get
	// published; then the router, which closes the subscriber and, through
	// its handlers, may close a publisher the API still uses.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), once.Config().LeaseTTL)
	defer cancel()
	err = errors.Join(ignoreClosed(err), srv.Shutdown(shutdownCtx), router.Close(), pubSub.Close())
	return err
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// openStore returns the Redis store at redisURL (redis://host:port/db), or,
// when redisURL is empty, an in-memory store.
func openStore(redisURL string) (idempotency.Store, func(), error) {
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

// newAPI returns the payments API: POST /payments (idempotent) and
// GET /payments/{id}, behind bearer authentication. Each payment is
// announced on paymentsTopic through publisher.
func newAPI(once *idempotency.Once, publisher message.Publisher) (http.Handler, error) {
	// Scope is required: without it, a client sending another client's
	// Idempotency-Key would get that client's stored response. The API key
	// is hashed in the stored keys, so it never appears in Redis.
	idem, err := httpidem.New(once, &httpidem.Config{Scope: apiKey})
	if err != nil {
		return nil, err
	}
	l := &ledger{payments: map[string]payment{}, publisher: publisher}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", l.create)
	mux.HandleFunc("GET /payments/{id}", l.get)
	// The idempotency middleware sits after authentication, so that its
	// scope is the authenticated API key, and wraps the whole mux: GET
	// passes through it untouched.
	return authenticate(idem.Handler(mux)), nil
}

// newConsumer returns a router whose receipts handler sends one receipt
// per payment event, deduplicated by the event's requestId.
func newConsumer(once *idempotency.Once, subscriber message.Subscriber, r *receipts, logger watermill.LoggerAdapter) (*message.Router, error) {
	idem, err := idempotency.New(once, nil)
	if err != nil {
		return nil, err
	}
	// CloseTimeout gives the handlers in flight 10 s to finish, so that
	// their outcome gets recorded, instead of the default 30 s.
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("receipts", paymentsTopic, subscriber, r.send).AddMiddleware(idem.Middleware)
	return router, nil
}

// apiKey is the idempotency scope: the caller's API key.
func apiKey(r *http.Request) string {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return key
}

func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if apiKey(r) == "" {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "send Authorization: Bearer <api key>"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

type payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

// ledger stands for the bank: the side effect the API must not repeat.
type ledger struct {
	mu        sync.Mutex
	payments  map[string]payment
	publisher message.Publisher
}

func (l *ledger) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Amount <= 0 || len(req.Currency) != 3 {
		writeJSON(w, http.StatusBadRequest, map[string]string{
			"error": "send {\"amount\": a positive integer in minor units, \"currency\": a 3-letter code}",
		})
		return
	}
	// The key to hand on: the parsed Idempotency-Key (sent quoted or bare,
	// one value) under the caller's scope (two callers' keys never meet).
	// Never forward the raw header: "k" and k are one key here, but would
	// be two at the consumer.
	forward, _ := httpidem.ForwardKey(r.Context())
	// The payment id derives from it, as a bank's own idempotency reference
	// would: even a rerun after a crash names the same payment.
	sum := sha256.Sum256([]byte(forward))
	p := payment{ID: "pay_" + hex.EncodeToString(sum[:6]), Amount: req.Amount, Currency: strings.ToLower(req.Currency), Status: "succeeded"}
	l.mu.Lock()
	l.payments[p.ID] = p
	l.mu.Unlock()
	// The event carries the forward key as its requestId, so that the
	// consumer runs once per payment however often this handler runs: a
	// retry after a failed publish publishes the same requestId again.
	body, err := json.Marshal(p)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	event := message.NewMessage(watermill.NewUUID(), body)
	event.Metadata.Set("requestId", forward)
	if err := l.publisher.Publish(paymentsTopic, event); err != nil {
		// A 5xx marks the key FAILED: the client's retry runs this again.
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "payment recorded, its event not published: retry with the same Idempotency-Key"})
		return
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

func (l *ledger) get(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	p, ok := l.payments[r.PathValue("id")]
	l.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such payment"})
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// receipts stands for the mail server: one receipt per payment, the
// consumer's side effect.
type receipts struct {
	mu   sync.Mutex
	sent []string // the payment ids, one per receipt sent
}

func newReceipts() *receipts { return &receipts{} }

// send sends the receipt of one payment event.
func (r *receipts) send(msg *message.Message) error {
	var p payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil {
		return fmt.Errorf("payment event %s: %w", msg.UUID, err)
	}
	r.mu.Lock()
	r.sent = append(r.sent, p.ID)
	r.mu.Unlock()
	return nil
}

// Sent returns the payment ids of the receipts sent, in order.
func (r *receipts) Sent() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sent...)
}
