package httpidem

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// errFuzzPanic is the only panic allowed out of the middleware: the
// handler's own, passed on.
var errFuzzPanic = fmt.Errorf("fuzz handler panics")

type fuzzReq struct {
	method, key, tenant string
	body                []byte
}

// FuzzMiddleware sends a request, a second one (sharing the first's key,
// tenant or body when asked) and the first again, with fuzzed methods,
// header values and bodies. It checks that the middleware never panics
// (other than passing on the handler's panic), and never answers 2xx unless
// the handler ran for that very request, or the answer is a marked replay
// of a response the handler gave earlier to the same tenant, key, method
// and body. It also checks that a key never runs again once completed.
func FuzzMiddleware(f *testing.F) {
	// The handler answers by the body's first byte modulo 5: 201 ("P"), 200
	// ("\x01"), 400 ("\x02"), 500 ("\x03") or a panic ("\x04").
	f.Add("POST", "k1", "t", []byte("P amount=1"), "POST", "k2", "t", []byte("P amount=1"), true, true, true)
	f.Add("POST", "k1", "t", []byte("P amount=1"), "POST", "k1", "t", []byte("P amount=2"), true, true, false)
	f.Add("POST", "k1", "alice", []byte("P amount=1"), "POST", "k1", "bob", []byte("P amount=1"), true, false, true)
	f.Add("PATCH", "k1", "t", []byte("\x01 ok"), "POST", "k1", "t", []byte("\x01 ok"), true, true, true)
	f.Add("PATCH", `"k\"1"`, "a:b", []byte("c"), "PATCH", `k"1`, "a", []byte("b:c"), false, false, false)
	f.Add("POST", "", "", []byte{}, "GET", "", "", []byte{}, false, false, false)
	f.Add("POST", "k\x00", "t", []byte("\x03fail"), "POST", "é", "t", []byte("\x04panic"), false, false, false)
	f.Add("POST", "k", "t", []byte("\x03fail"), "POST", "k", "t", []byte("\x03fail"), true, true, true)
	f.Add("POST", "k", "t", []byte("\x04panic"), "POST", "k", "t", []byte{}, true, true, true)
	f.Add("POST", "k", "t", bytes.Repeat([]byte("B"), 300), "POST", "k", "t", bytes.Repeat([]byte("b"), 90), true, true, false)
	f.Add("post", "k", "", []byte("\x02bad"), "PATCH", "k", "", []byte("\x02bad"), true, true, true)
	f.Fuzz(func(t *testing.T, m1, k1, t1 string, b1 []byte, m2, k2, t2 string, b2 []byte, sameKey, sameTenant, sameBody bool) {
		if sameKey {
			k2 = k1
		}
		if sameTenant {
			t2 = t1
		}
		if sameBody {
			b2 = b1
		}
		store := memstore.New(nil)
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, MaxOutputSize: 96})
		if err != nil {
			t.Fatal(err)
		}
		m, err := New(once, &Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") }, MaxRequestBody: 256})
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			body, _ := io.ReadAll(r.Body)
			status := http.StatusCreated
			if len(body) > 0 {
				switch body[0] % 5 {
				case 1:
					status = http.StatusOK
				case 2:
					status = http.StatusBadRequest
				case 3:
					status = http.StatusInternalServerError
				case 4:
					panic(errFuzzPanic)
				}
			}
			w.Header().Set("X-Run", fmt.Sprint(runs))
			w.WriteHeader(status)
			fmt.Fprintf(w, "run %d %q %q", runs, r.Method, body)
		}))

		type produced struct {
			req    fuzzReq
			status int
			header http.Header
			body   string
		}
		var history []produced
		completed := map[string]bool{} // tenant and parsed key of completed runs
		reqs := []fuzzReq{{m1, k1, t1, b1}, {m2, k2, t2, b2}, {m1, k1, t1, b1}}
		for i, fr := range reqs {
			req := &http.Request{
				Method: fr.method, URL: &url.URL{Path: "/pay"}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header:        http.Header{"X-Tenant": {fr.tenant}},
				Body:          io.NopCloser(bytes.NewReader(fr.body)),
				ContentLength: int64(len(fr.body)),
			}
			if fr.key != "" {
				req.Header.Set(defaultHeader, fr.key)
			}
			req = req.WithContext(t.Context())
			before := runs
			rec := httptest.NewRecorder()
			panicked := func() (v any) {
				defer func() { v = recover() }()
				h.ServeHTTP(rec, req)
				return nil
			}()
			ran := runs > before
			if panicked != nil {
				if panicked != errFuzzPanic || !ran {
					t.Fatalf("request %d: panic %v (handler ran: %v)", i, panicked, ran)
				}
				continue
			}
			resp := rec.Result()
			body, _ := io.ReadAll(resp.Body)
			guarded := slices.Contains([]string{http.MethodPost, http.MethodPatch}, fr.method)
			parsed, keyErr := parseKey(fr.key)
			id := storeKey("", fr.tenant, parsed)

			if guarded && (fr.key == "" || keyErr != nil) && (resp.StatusCode != http.StatusBadRequest || ran) {
				t.Fatalf("request %d: key %q (%v) answered %d, handler ran: %v", i, fr.key, keyErr, resp.StatusCode, ran)
			}
			if ran && guarded && completed[id] {
				t.Fatalf("request %d: handler ran again for completed key %q of tenant %q", i, parsed, fr.tenant)
			}
			replayed := resp.Header.Get(ReplayedHeader) == "true"
			if ran && replayed {
				t.Fatalf("request %d: handler ran, yet the answer is marked replayed", i)
			}
			if resp.StatusCode >= 200 && resp.StatusCode < 300 && !ran {
				if !replayed {
					t.Fatalf("request %d: %d without the handler running or a replay: %s", i, resp.StatusCode, body)
				}
				match := slices.IndexFunc(history, func(p produced) bool {
					want := p.header.Clone()
					want.Set(ReplayedHeader, "true")
					return p.req.tenant == fr.tenant && p.req.method == fr.method && bytes.Equal(p.req.body, fr.body) &&
						p.status == resp.StatusCode && p.body == string(body) && fmt.Sprint(want) == fmt.Sprint(resp.Header)
				})
				if match < 0 {
					t.Fatalf("request %d: replayed %d %q matches no earlier response of this tenant and request", i, resp.StatusCode, body)
				}
				if pk, _ := parseKey(history[match].req.key); pk != parsed {
					t.Fatalf("request %d: replayed the response of key %q to key %q", i, pk, parsed)
				}
			}
			if ran {
				history = append(history, produced{fr, resp.StatusCode, resp.Header, string(body)})
				if guarded && resp.StatusCode < 500 {
					completed[id] = true
				}
			}
		}
	})
}
