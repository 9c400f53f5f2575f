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
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

func ExampleTransport() {
	store := memstore.New(nil)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	if err != nil {
		panic(err)
	}
	idem, err := httpidem.New(once, &httpidem.Config{SingleTenant: true})
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

	// Base sees every attempt: wrap it to log, count or trace them.
	attempts := 0
	transport := &httpidem.Transport{
		Backoff: time.Millisecond,
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := http.DefaultTransport.RoundTrip(r)
			attempts++
			if err == nil {
				fmt.Printf("attempt %d: %d, key sent: %t\n", attempts, resp.StatusCode, r.Header.Get("Idempotency-Key") != "")
			}
			return resp, err
		}),
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
	// attempt 1: 503, key sent: true
	// attempt 2: 201, key sent: true
	// 201 paid, run 2
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
