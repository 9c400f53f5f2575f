package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/examples/internal/demo"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

func main() {
	// The store is Redis at REDIS_URL, or in memory when it is unset.
	demo.Main("http example", func(store idempotency.Store, logger watermill.LoggerAdapter) error {
		api, err := newAPI(store, logger)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
		return demo.Serve(logger, "Payments API", "127.0.0.1:8080", srv.Serve, func() error {
			// Shutdown waits for running requests, so that their outcome
			// gets recorded.
			ctx, cancel := context.WithTimeout(context.Background(), httpidem.DefaultLeaseTTL)
			defer cancel()
			return srv.Shutdown(ctx)
		})
	})
}

// newAPI returns the payments API: POST /payments (idempotent) and
// GET /payments/{id}, behind bearer authentication.
func newAPI(store idempotency.Store, logger watermill.LoggerAdapter) (http.Handler, error) {
	// Scope is required: without it, a client sending another client's
	// Idempotency-Key would get that client's stored response. The API key
	// is hashed in the stored keys, so it never appears in Redis.
	idem, err := httpidem.New(httpidem.Config{Store: store, Scope: apiKey}, logger)
	if err != nil {
		return nil, err
	}
	l := &ledger{payments: map[string]payment{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", l.create)
	mux.HandleFunc("GET /payments/{id}", l.get)
	// The idempotency middleware sits after authentication, so that its
	// scope is the authenticated API key, and wraps the whole mux: GET
	// passes through it untouched.
	return authenticate(idem.Handler(mux)), nil
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
	mu       sync.Mutex
	payments map[string]payment
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
	// The payment id derives from the caller and its Idempotency-Key, as a
	// bank's own idempotency reference would: even a rerun after a crash
	// names the same payment.
	sum := sha256.Sum256([]byte(apiKey(r) + "\x00" + r.Header.Get(httpidem.DefaultHeader)))
	p := payment{ID: "pay_" + hex.EncodeToString(sum[:6]), Amount: req.Amount, Currency: strings.ToLower(req.Currency), Status: "succeeded"}
	l.mu.Lock()
	l.payments[p.ID] = p
	l.mu.Unlock()
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
