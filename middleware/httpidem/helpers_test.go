package httpidem_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
)

// storeKind builds a fresh store for one test, and a key prefix unique to it.
type storeKind = adaptertest.StoreKind

var storeKinds = adaptertest.StoreKinds("httpidem", "httpidemtest")

// eachStore runs f once per store kind.
func eachStore(t *testing.T, f func(t *testing.T, kind storeKind)) {
	for _, k := range storeKinds {
		t.Run(k.Name, func(t *testing.T) { f(t, k) })
	}
}

// eachStoreInBubble runs f once per store kind, the in-process store's run
// inside a synctest bubble: its leases, renewals and store timeouts run on
// the bubble's clock, which moves only when every goroutine waits, so they
// take no real time and fire in a fixed order. The Redis run needs the
// network, which a bubble cannot wait on, and keeps the real clock. f must
// build what it waits on (stores, handlers, channels) itself, and must not
// call t.Run or t.Parallel.
func eachStoreInBubble(t *testing.T, f func(t *testing.T, kind storeKind)) {
	for _, k := range storeKinds {
		t.Run(k.Name, func(t *testing.T) {
			if k.Name != "memstore" {
				f(t, k)
				return
			}
			synctest.Test(t, func(t *testing.T) { f(t, k) })
		})
	}
}

// payments is the handler under test. Its answer depends on the path:
//
//	/pay    201, JSON echoing the run number, method and body
//	/bad    400, a validation error of the handler's own
//	/fail   503 from the handler, a failure
//	/big    201 with a 2 KiB body
//	/panic  panics
//	/block  signals started, waits for release, then answers as /pay
type payments struct {
	runs    atomic.Int64
	started chan string
	release chan struct{}
}

func newPayments() *payments {
	return &payments{started: make(chan string, 64), release: make(chan struct{})}
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.runs.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		panic(err)
	}
	switch r.URL.Path {
	case "/bad":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":"amount missing","run":%d}`, n)
		return
	case "/fail":
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "bank down, run %d", n)
		return
	case "/big":
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(strings.Repeat("x", 2048)))
		return
	case "/panic":
		panic("handler panics")
	case "/block":
		p.started <- r.Header.Get("Idempotency-Key")
		select {
		case <-p.release:
		case <-r.Context().Done():
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(n, 10))
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"method":%q,"body":%q}`, n, r.Method, body)
}

// tenantScope scopes keys by the X-Tenant header, as an authenticated
// subject would.
func tenantScope(r *http.Request) string { return r.Header.Get("X-Tenant") }

// config is what a test sets: the Once's settings and the middleware's.
type config struct {
	idempotency.OnceConfig
	httpidem.Config
}

// build returns the middleware of cfg, on a Once of its own.
func build(cfg config) (*httpidem.Middleware, error) {
	once, err := idempotency.NewOnce(cfg.OnceConfig)
	if err != nil {
		return nil, err
	}
	return httpidem.New(once, &cfg.Config)
}

// newMiddleware builds a middleware on store with the test's prefix and
// tenant scope; adjust may change the config first.
func newMiddleware(t testing.TB, store idempotency.Store, prefix string, adjust func(*config)) *httpidem.Middleware {
	t.Helper()
	cfg := config{OnceConfig: idempotency.OnceConfig{Store: store}, Config: httpidem.Config{KeyPrefix: prefix, Scope: tenantScope}}
	if adjust != nil {
		adjust(&cfg)
	}
	m, err := build(cfg)
	require.NoError(t, err)
	return m
}

// result is one response as the client saw it.
type result struct {
	status   int
	header   http.Header
	body     string
	panicked any
}

// serve runs one request through h in-process; a panic that escapes h is
// caught and reported, as net/http would.
func serve(h http.Handler, req *http.Request) (res result) {
	rec := httptest.NewRecorder()
	defer func() {
		if v := recover(); v != nil {
			res = result{panicked: v}
		}
	}()
	h.ServeHTTP(rec, req)
	resp := rec.Result()
	body, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(body)}
}
