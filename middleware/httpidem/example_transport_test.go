package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

func ExampleTransport() {
	store := memstore.New(nil)
	idem, err := httpidem.New(httpidem.Config{Store: store, SingleTenant: true}, nil)
	if err != nil {
		panic(err)
	}
	var runs atomic.Int32
	srv := httptest.NewServer(idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := runs.Add(1)
		if run == 1 { // the bank is down: 503, the key is FAILED, a retry may run again
			http.Error(w, "bank unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "paid, run %d", run)
	})))
	defer srv.Close()

	transport, err := httpidem.NewTransport(httpidem.TransportConfig{
		BackoffBase: time.Millisecond,
		OnAttempt: func(a httpidem.Attempt) {
			fmt.Printf("attempt %d: %d, key sent: %t, then %s\n", a.Number, a.Status, a.Key != "", a.Verdict)
		},
	}, nil)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: transport}
	resp, err := client.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":1000}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s\n", resp.StatusCode, body)
	// Output:
	// attempt 1: 503, key sent: true, then retry
	// attempt 2: 201, key sent: true, then done
	// 201 paid, run 2
}
