package httpidem_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
)

// counted is a handler that counts its runs and answers 201 with the run
// number, the method and the body it got, after calling hook (when set),
// which may answer itself (true).
type counted struct {
	runs atomic.Int64
	hook func(n int64, w http.ResponseWriter, r *http.Request) bool
}

func (c *counted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if c.hook != nil && c.hook(n, w, r) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"run":`+strconv.FormatInt(n, 10)+`,"method":"`+r.Method+`","body":`+strconv.Quote(string(body))+`}`)
}

// idemServer serves h behind the middleware on kind's store (adjust may
// change the Config), with a fault proxy in front of it.
func idemServer(t *testing.T, kind storeKind, h http.Handler, adjust func(*config)) (*httptest.Server, *testserver.FaultProxy) {
	t.Helper()
	store, prefix := kind.New(t)
	srv := httptest.NewServer(newMiddleware(t, store, prefix, adjust).Handler(h))
	t.Cleanup(srv.Close)
	return srv, testserver.StartFaultProxy(t, srv.Listener.Addr().String())
}

// TestTransportConnectionLostWhileRunning: the connection breaks while
// the handler still runs (no answer at all reaches the client). The retry
// lands while the key is IN_PROGRESS and gets 409 with Retry-After; the
// first run ends during that pause, and the next attempt gets the replay.
// The handler ran once.
func TestTransportConnectionLostWhileRunning(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		started, release := make(chan struct{}, 1), make(chan struct{})
		h := &counted{hook: func(n int64, w http.ResponseWriter, r *http.Request) bool {
			started <- struct{}{}
			<-release // the client's leaving does not stop it
			return false
		}}
		_, proxy := idemServer(t, kind, h, nil)
		tr, rec := newTransport(t, func(c *httpidem.Transport) { c.MaxAttempts = 10 })
		var once sync.Once
		rec.then = func(a httpidem.Attempt) {
			if a.Status == http.StatusConflict {
				once.Do(func() { close(release) })
			}
		}
		go func() {
			<-started
			proxy.ResetAll()
		}()
		got, resp, err := call(t, tr, newPost(t, context.Background(), "http://"+proxy.Addr+"/pay", `{"amount":7}`))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, got.status, got.body)
		assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
		assert.Contains(t, got.body, `"run":1,`)
		assert.EqualValues(t, 1, h.runs.Load(), "handler runs")
		requireOneKey(t, rec, resp)
		all := rec.all()
		require.GreaterOrEqual(t, len(all), 3, "%v", rec.verdicts())
		assert.Error(t, all[0].Err, "the first attempt got no answer")
		assert.Equal(t, httpidem.VerdictRetry, all[0].Verdict)
		assert.Equal(t, http.StatusConflict, all[1].Status)
		assert.Equal(t, time.Second, all[1].Wait, "the server's Retry-After")
		for _, a := range all[1 : len(all)-1] {
			assert.Equal(t, http.StatusConflict, a.Status, "attempt %d", a.Number)
		}
		assert.True(t, all[len(all)-1].Replayed)
	})
}

// TestTransportFailedThenRerun: the handler's 500 leaves the key FAILED;
// the retry runs it again and gets its 201, not a replay. A later call
// with the key gets that 201 replayed, and runs nothing.
func TestTransportFailedThenRerun(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		h := &counted{hook: func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 1 {
				w.WriteHeader(http.StatusInternalServerError)
				return true
			}
			return false
		}}
		srv, _ := idemServer(t, kind, h, nil)
		tr, rec := newTransport(t, nil)
		got, resp, err := call(t, tr, newPost(t, context.Background(), srv.URL+"/pay", `{"amount":7}`))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, got.status)
		assert.Empty(t, got.header.Get(httpidem.ReplayedHeader))
		assert.Contains(t, got.body, `"run":2,`)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry, httpidem.VerdictDone}, rec.verdicts())
		key := requireOneKey(t, rec, resp)

		again, _, err := call(t, tr, newPost(t, httpidem.WithKey(context.Background(), key), srv.URL+"/pay", `{"amount":7}`))
		require.NoError(t, err)
		assert.Equal(t, got.body, again.body)
		assert.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
		assert.EqualValues(t, 2, h.runs.Load(), "the failed run and the one that succeeded")
	})
}

// TestTransportRetryAfterPastDeadline: a 503 whose Retry-After ends after
// the request's deadline, or exceeds MaxRetryAfter, is returned at once,
// after one attempt; the failed run is the only one.
func TestTransportRetryAfterPastDeadline(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		retryAfter := "20"
		h := &counted{hook: func(n int64, w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Retry-After", retryAfter)
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}}
		srv, _ := idemServer(t, kind, h, nil)

		tr, rec := newTransport(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got, _, err := call(t, tr, newPost(t, ctx, srv.URL+"/pay", `{}`))
		require.NoError(t, err, "the 503 is returned before the deadline, not waited for")
		assert.Equal(t, http.StatusServiceUnavailable, got.status)
		assert.Equal(t, "20", got.header.Get("Retry-After"), "the caller sees the server's Retry-After")
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictTooLong}, rec.verdicts())

		retryAfter = "31"
		tr, rec = newTransport(t, nil)
		got, _, err = call(t, tr, newPost(t, context.Background(), srv.URL+"/pay", `{}`))
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, got.status)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictTooLong}, rec.verdicts(), "over MaxRetryAfter (30 s)")
		assert.EqualValues(t, 2, h.runs.Load())
	})
}

// TestTransportMaxAttemptsOne: with MaxAttempts 1, a lost answer is the
// caller's CallError at once; the caller retries with its key and gets
// the replay.
func TestTransportMaxAttemptsOne(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		h := &counted{}
		_, proxy := idemServer(t, kind, h, nil)
		tr, rec := newTransport(t, func(c *httpidem.Transport) { c.MaxAttempts = 1 })
		proxy.ResetMidReply()
		_, _, err := call(t, tr, newPost(t, context.Background(), "http://"+proxy.Addr+"/pay", `{"amount":7}`))
		var ce *httpidem.CallError
		require.ErrorAs(t, err, &ce)
		assert.Len(t, rec.all(), 1, "attempts")
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictExhausted}, rec.verdicts())
		assert.EqualValues(t, 1, h.runs.Load(), "the server ran it; the answer was lost")

		got, _, err := call(t, tr, newPost(t, httpidem.WithKey(context.Background(), ce.Key), "http://"+proxy.Addr+"/pay", `{"amount":7}`))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, got.status)
		assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
		assert.EqualValues(t, 1, h.runs.Load())
	})
}

// TestTransportClientTimeout: under http.Client.Timeout, net/http may
// replace the error of a call that got no answer with its own (when its
// timer fires before the request's context ends, both at the deadline), so
// no *CallError names the key. A caller that chose the key with WithKey
// retries with the same context and gets the replay. The handler ran once.
func TestTransportClientTimeout(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		h := &counted{hook: func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 1 {
				<-r.Context().Done() // the bank is slow; the client times out
			}
			return false
		}}
		idem := newMiddleware(t, store, prefix, nil).Handler(h)
		served := make(chan struct{}, 2)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			idem.ServeHTTP(w, r)
			served <- struct{}{} // the outcome is recorded
		}))
		t.Cleanup(srv.Close)
		tr, _ := newTransport(t, nil)
		client := &http.Client{Transport: tr, Timeout: 200 * time.Millisecond}
		pay := func(ctx context.Context) (*http.Response, error) {
			req := newPost(t, ctx, srv.URL+"/pay", `{"amount":7}`)
			req.Header.Set("X-Tenant", "tenant-a")
			return client.Do(req)
		}

		ctx := httpidem.WithKey(context.Background(), "timeout-"+kind.Name) // known whatever the call returns
		_, err := pay(ctx)
		require.Error(t, err)
		var te interface{ Timeout() bool }
		require.ErrorAs(t, err, &te)
		assert.True(t, te.Timeout(), "%v", err)
		<-served

		resp, err := pay(ctx)
		require.NoError(t, err)
		_ = resp.Body.Close()
		<-served
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		assert.Equal(t, "true", resp.Header.Get(httpidem.ReplayedHeader))
		assert.Equal(t, "timeout-"+kind.Name, resp.Request.Header.Get("Idempotency-Key"))
		assert.EqualValues(t, 1, h.runs.Load())
	})
}

// TestTransportOneKeyManyGoroutines: goroutines share a Transport and
// one WithKey context. Same body: one run, every caller gets its answer
// (the others after 409s, as a replay). Different bodies: one run, the
// other callers get 422 (or 409s and then 422), never a second run.
func TestTransportOneKeyManyGoroutines(t *testing.T) {
	const n = 12
	for _, sameBody := range []bool{true, false} {
		t.Run("same body "+strconv.FormatBool(sameBody), func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) {
				started, release := make(chan struct{}, n), make(chan struct{})
				h := &counted{hook: func(int64, http.ResponseWriter, *http.Request) bool {
					started <- struct{}{}
					<-release
					return false
				}}
				srv, _ := idemServer(t, kind, h, nil)
				tr, rec := newTransport(t, func(c *httpidem.Transport) { c.MaxAttempts = 20 })
				var conflicts atomic.Int64
				var once sync.Once
				rec.then = func(a httpidem.Attempt) {
					met := a.Status == http.StatusConflict || a.Status == http.StatusUnprocessableEntity
					if met && a.Number == 1 && conflicts.Add(1) == n-1 {
						once.Do(func() { close(release) }) // every other caller met the first run
					}
				}
				ctx := httpidem.WithKey(context.Background(), "shared-"+kind.Name+strconv.FormatBool(sameBody))
				answers := make([]answer, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						body := `{"amount":7}`
						if !sameBody {
							body = `{"amount":` + strconv.Itoa(i) + `}`
						}
						got, _, err := call(t, tr, newPost(t, ctx, srv.URL+"/pay", body))
						if assert.NoError(t, err) {
							answers[i] = got
						}
					})
				}
				wg.Wait()
				assert.EqualValues(t, 1, h.runs.Load(), "handler runs")
				var created, replayed, reused int
				for _, a := range answers {
					switch {
					case a.status == http.StatusCreated && a.header.Get(httpidem.ReplayedHeader) == "true":
						replayed++
					case a.status == http.StatusCreated:
						created++
					case a.status == http.StatusUnprocessableEntity:
						reused++
					default:
						t.Errorf("unexpected answer %d %s", a.status, a.body)
					}
				}
				assert.Equal(t, 1, created, "one first answer")
				if sameBody {
					assert.Equal(t, n-1, replayed)
				} else {
					assert.Equal(t, n-1, reused)
				}
			})
		})
	}
}

// TestTransportHeaderAndMethods: a lost answer is retried and replayed
// for PATCH, for a POST without a body, and under a key header of the
// server's own name; the handler runs once each time.
func TestTransportHeaderAndMethods(t *testing.T) {
	cases := []struct {
		name, method, header string
		body                 bool
	}{
		{name: "PATCH", method: http.MethodPatch, body: true},
		{name: "POST without a body", method: http.MethodPost},
		{name: "custom header", method: http.MethodPost, header: "X-Request-Key", body: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) {
				var seen atomic.Value
				h := &counted{hook: func(_ int64, _ http.ResponseWriter, r *http.Request) bool {
					seen.Store(r.Header.Get(c.header))
					return false
				}}
				_, proxy := idemServer(t, kind, h, func(cfg *config) { cfg.Header = c.header })
				tr, rec := newTransport(t, func(cfg *httpidem.Transport) { cfg.Header = c.header })
				proxy.ResetMidReply()
				var body io.Reader
				if c.body {
					body = strings.NewReader(`{"amount":7}`)
				}
				req, err := http.NewRequest(c.method, "http://"+proxy.Addr+"/pay", body)
				require.NoError(t, err)
				got, resp, err := call(t, tr, req)
				require.NoError(t, err)
				assert.Equal(t, http.StatusCreated, got.status, got.body)
				assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
				assert.EqualValues(t, 1, h.runs.Load())
				assert.Equal(t, 1, proxy.Resets())
				header := c.header
				if header == "" {
					header = "Idempotency-Key"
				}
				key := resp.Request.Header.Get(header)
				assert.Len(t, key, 36)
				if c.header != "" {
					assert.Equal(t, key, seen.Load(), "the server got the key under its header")
				}
				assert.GreaterOrEqual(t, len(rec.all()), 2)
			})
		})
	}
}

// TestTransportHTTP2ConnectionLost: over HTTP/2, the server's connection
// breaks while the handler runs, after its effect. The retry gets the
// replay (or a 409 and then the replay); the handler ran once.
func TestTransportHTTP2ConnectionLost(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		type connKey struct{}
		h := &counted{hook: func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 1 {
				_ = r.Context().Value(connKey{}).(net.Conn).Close()
			}
			return false
		}}
		store, prefix := kind.New(t)
		srv := httptest.NewUnstartedServer(newMiddleware(t, store, prefix, nil).Handler(h))
		srv.EnableHTTP2 = true
		srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		base := srv.Client().Transport.(*http.Transport).Clone()
		t.Cleanup(base.CloseIdleConnections)
		tr, rec := newTransport(t, func(c *httpidem.Transport) { c.Base, c.MaxAttempts = base, 10 })

		got, resp, err := call(t, tr, newPost(t, context.Background(), srv.URL+"/pay", `{"amount":7}`))
		require.NoError(t, err)
		assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2")
		assert.Equal(t, http.StatusCreated, got.status, got.body)
		assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
		assert.EqualValues(t, 1, h.runs.Load(), "handler runs")
		requireOneKey(t, rec, resp)
		all := rec.all()
		require.GreaterOrEqual(t, len(all), 2)
		assert.Error(t, all[0].Err)
		t.Logf("attempt 1: %v; verdicts %v", all[0].Err, rec.verdicts())
	})
}

// TestTransportRetriesLeaveNoConnections: the responses a call retries
// are closed; once the caller closed the last one and the idle
// connections, the server has no connection left open.
func TestTransportRetriesLeaveNoConnections(t *testing.T) {
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	var runs atomic.Int64
	big := strings.Repeat("x", 256<<10) // more than a connection buffers
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) < 5 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, big)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			open[c] = true
		case http.StateClosed, http.StateHijacked:
			delete(open, c)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr, rec := newTransport(t, nil)
	resp, err := tr.RoundTrip(newPost(t, context.Background(), srv.URL, "{}"))
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Len(t, rec.all(), 5)
	require.NoError(t, resp.Body.Close())
	tr.CloseIdleConnections()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(open) == 0
	}, 10*time.Second, 5*time.Millisecond, "connections still open on the server")
}

// TestTransportRedirectHops: http.Client follows a 308 that resends the
// body, each hop a request of its own to the Transport; both answers are
// cut once. Each hop is retried with its own key (or the context's, the
// same on both hops), its body rewound; the target's handler runs once and
// the retry gets its replay.
func TestTransportRedirectHops(t *testing.T) {
	for _, withKey := range []bool{false, true} {
		t.Run("WithKey "+strconv.FormatBool(withKey), func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) {
				store, prefix := kind.New(t)
				h := &counted{}
				mux := http.NewServeMux()
				var hop1 atomic.Value
				mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) {
					hop1.Store(r.Header.Get("Idempotency-Key"))
					http.Redirect(w, r, "/pay", http.StatusPermanentRedirect)
				})
				mux.Handle("/pay", newMiddleware(t, store, prefix, nil).Handler(h))
				srv := httptest.NewServer(mux)
				t.Cleanup(srv.Close)
				proxy := testserver.StartFaultProxy(t, srv.Listener.Addr().String())
				tr, rec := newTransport(t, nil)
				proxy.ResetMidReply() // the 308
				rec.then = func(a httpidem.Attempt) {
					if a.Request.URL.Path == "/old" && a.Verdict == httpidem.VerdictDone {
						proxy.ResetMidReply() // the 201
					}
				}

				ctx := context.Background()
				if withKey {
					ctx = httpidem.WithKey(ctx, "redirected-"+prefix)
				}
				got, resp, err := call(t, tr, newPost(t, ctx, "http://"+proxy.Addr+"/old", `{"amount":7}`))
				require.NoError(t, err)
				assert.Equal(t, 2, proxy.Resets())
				assert.Equal(t, http.StatusCreated, got.status, got.body)
				assert.Contains(t, got.body, `"body":"{\"amount\":7}"`, "the body was rewound for the second hop")
				assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
				assert.EqualValues(t, 1, h.runs.Load())
				key := resp.Request.Header.Get("Idempotency-Key")
				if withKey {
					assert.Equal(t, "redirected-"+prefix, key)
					assert.Equal(t, key, hop1.Load())
				} else {
					assert.Len(t, key, 36)
					assert.NotEqual(t, key, hop1.Load(), "each hop has its own key")
				}
				var hops []string
				for _, a := range rec.all() {
					hops = append(hops, a.Request.URL.Path+" "+string(a.Verdict))
				}
				assert.Equal(t, []string{"/old retry", "/old done", "/pay retry", "/pay done"}, hops)
			})
		})
	}
}

// TestTransportReplayIsFinal: a handler's own 409 with Retry-After, or
// 429, is stored as its answer; the retry gets it replayed, and a replay
// never changes for the key, so it goes to the caller at once: two
// attempts, not MaxAttempts spent waiting on a stored answer. The handler
// ran once.
func TestTransportReplayIsFinal(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			eachStore(t, func(t *testing.T, kind storeKind) {
				h := &counted{hook: func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(status)
					_, _ = io.WriteString(w, "the account is locked")
					return true
				}}
				srv, _ := idemServer(t, kind, h, nil)
				tr, rec := newTransport(t, nil)
				got, _, err := call(t, tr, newPost(t, context.Background(), srv.URL+"/pay", `{"amount":7}`))
				require.NoError(t, err)
				assert.Equal(t, status, got.status)
				assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
				assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry, httpidem.VerdictDone}, rec.verdicts())
				assert.EqualValues(t, 1, h.runs.Load())
			})
		})
	}
}

// TestTransportStoreUnavailable: the server's first claim was applied but
// its reply lost, so the server answers 503 with Retry-After without
// running the handler. The Transport waits that long and sends the call
// again with its key, and the handler runs once.
func TestTransportStoreUnavailable(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		inner, prefix := kind.New(t)
		store := faultstore.New(inner).On("claim", faultstore.First(1, faultstore.LoseReply(errors.New("store reply lost"))))
		h := &counted{}
		srv := httptest.NewServer(newMiddleware(t, store, prefix, nil).Handler(h))
		t.Cleanup(srv.Close)
		tr, rec := newTransport(t, nil)
		got, resp, err := call(t, tr, newPost(t, context.Background(), srv.URL+"/pay", `{"amount":7}`))
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, got.status, got.body)
		assert.Contains(t, got.body, `"run":1,`)
		assert.EqualValues(t, 1, h.runs.Load())
		requireOneKey(t, rec, resp)
		all := rec.all()
		require.Len(t, all, 2)
		assert.Equal(t, http.StatusServiceUnavailable, all[0].Status)
		assert.Equal(t, time.Second, all[0].Wait, "the server's Retry-After")
		assert.EqualValues(t, 2, store.Calls("claim"))
	})
}
