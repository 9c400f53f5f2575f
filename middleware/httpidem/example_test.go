package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

func Example() {
	store := memstore.New(nil) // redisstore in production

	// One Once per process: the store, the lease, the TTLs, the cache.
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	if err != nil {
		panic(err)
	}
	idem, err := httpidem.New(once, &httpidem.Config{
		// Keep tenants apart: here the API key names the tenant.
		Scope: func(r *http.Request) string { return r.Header.Get("X-Api-Key") },
	})
	if err != nil {
		panic(err)
	}

	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d","request":%s}`, charges, body)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("X-Api-Key", "tenant-1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), b)
		if !strings.HasSuffix(string(b), "\n") {
			fmt.Println()
		}
	}
	send("order-42", `{"amount":1000}`) // runs the handler
	send("order-42", `{"amount":1000}`) // a retry: the stored response
	send("order-42", `{"amount":9999}`) // the key reused for another request
	send("", `{"amount":1000}`)         // no key
	fmt.Println("charges:", charges)

	// Output:
	// 201 replayed="" {"id":"pay_1","request":{"amount":1000}}
	// 201 replayed="true" {"id":"pay_1","request":{"amount":1000}}
	// 422 replayed="" {"type":"https://github.com/idempotency/watermill-idempotency/blob/main/docs/GUARANTEES.md#key_reused","title":"Idempotency key reused for a different request","status":422,"detail":"This Idempotency-Key was first used for a different request (method, path, query or body). Use a new key for a new request."}
	// 400 replayed="" {"type":"https://github.com/idempotency/watermill-idempotency/blob/main/docs/GUARANTEES.md#missing_key","title":"Idempotency key is missing or invalid","status":400,"detail":"POST /payments requires an Idempotency-Key header: send a unique key (a V4 UUID, say) and reuse it when you retry."}
	// charges: 1
}
