package httpidem_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
	"github.com/idempotency/watermill-idempotency/middleware/internal/faultstore"
)

func TestStoreUnavailable(t *testing.T) {
	for _, ds := range adaptertest.DownStores {
		t.Run(ds.Name, func(t *testing.T) {
			t.Run("fail closed", func(t *testing.T) {
				api := newPayments()
				h := newMiddleware(t, ds.New(t), "", nil).Handler(api)
				for range 2 {
					got := serve(h, newRequest(step{keys: key("k1")}))
					require.Equal(t, http.StatusServiceUnavailable, got.status)
					requireProblem(t, got, http.StatusServiceUnavailable, storeUnavailable)
				}
				assert.Zero(t, api.runs.Load(), "the handler must not run without the store")
			})
			t.Run("fail open", func(t *testing.T) {
				api := newPayments()
				logger := watermill.NewCaptureLogger()
				m, err := build(config{OnceConfig: idempotency.OnceConfig{Store: ds.New(t), FailOpen: true, Logger: logger}, Config: httpidem.Config{SingleTenant: true}})
				require.NoError(t, err)
				for i := range 2 {
					got := serve(m.Handler(api), newRequest(step{keys: key("k1")}))
					require.Equal(t, http.StatusCreated, got.status)
					assert.Contains(t, got.body, fmt.Sprintf(`"run":%d`, i+1))
				}
				assert.EqualValues(t, 2, api.runs.Load(), "fail open runs every request")
				assert.Len(t, logger.Captured()[watermill.ErrorLogLevel], 2, "each unprotected run is logged")
			})
		})
	}
}

func TestCompleteRetriedWithinLease(t *testing.T) {
	errBlip := errors.New("flaky: connection reset")
	t.Run("store recovers", func(t *testing.T) {
		eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
			inner, prefix := kind.New(t)
			store := faultstore.New(inner).On("complete", faultstore.First(2, faultstore.Fail(errBlip)))
			api := newPayments()
			h := newMiddleware(t, store, prefix, nil).Handler(api)

			first := serve(h, newRequest(step{keys: key("k1")}))
			require.Equal(t, http.StatusCreated, first.status)
			assert.EqualValues(t, 3, store.Calls("complete"), "two failures, then success")
			again := serve(h, newRequest(step{keys: key("k1")}))
			requireReplay(t, first, again)
			assert.EqualValues(t, 1, api.runs.Load())
		})
	})
	t.Run("store stays down", func(t *testing.T) {
		eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
			inner, prefix := kind.New(t)
			store := faultstore.New(inner).On("complete", faultstore.Fail(errBlip))
			api := newPayments()
			logger := watermill.NewCaptureLogger()
			m, err := build(config{OnceConfig: idempotency.OnceConfig{Store: store, LeaseTTL: 150 * time.Millisecond, Logger: logger}, Config: httpidem.Config{KeyPrefix: prefix, Scope: tenantScope}})
			require.NoError(t, err)

			first := serve(m.Handler(api), newRequest(step{keys: key("k1")}))
			require.Equal(t, http.StatusCreated, first.status, "the client still gets the handler's answer")
			assert.Greater(t, store.Calls("complete"), int64(1), "retried")
			assert.NotEmpty(t, logger.Captured()[watermill.ErrorLogLevel], "giving up is logged")
		})
	})
}

// TestLeaseRenewed holds a handler for several leases: a repeat meanwhile
// is 409, never a second run.
func TestLeaseRenewed(t *testing.T) {
	eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		api := newPayments()
		// Renewals come every third of it: on a loaded machine a 150 ms
		// lease on a real Redis lapsed between two of them.
		lease := 500 * time.Millisecond
		h := newMiddleware(t, store, prefix, func(c *config) { c.LeaseTTL = lease }).Handler(api)

		first := make(chan result, 1)
		go func() { first <- serve(h, newRequest(step{keys: key("k1"), path: "/block"})) }()
		<-api.started
		time.Sleep(4 * lease) // a lease that were not renewed would expire meanwhile

		repeat := make(chan result, 1)
		go func() { repeat <- serve(h, newRequest(step{keys: key("k1"), path: "/block"})) }()
		select {
		case got := <-repeat:
			requireProblem(t, got, http.StatusConflict, inProgress)
		case <-api.started:
			t.Error("a second request took over a live, renewed lease")
		}
		close(api.release)
		assert.Equal(t, http.StatusCreated, (<-first).status)
		assert.EqualValues(t, 1, api.runs.Load())
	})
}

// TestLeaseLostCancelsHandler deletes the key under a running handler: the
// next renewal finds the lease lost and cancels the handler's context.
func TestLeaseLostCancelsHandler(t *testing.T) {
	eachStoreInBubble(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		started, cause := make(chan struct{}), make(chan error, 1)
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			<-r.Context().Done()
			cause <- context.Cause(r.Context())
			w.WriteHeader(http.StatusCreated)
		})
		h := newMiddleware(t, store, prefix, func(c *config) { c.LeaseTTL = 60 * time.Millisecond }).Handler(handler)

		done := make(chan result, 1)
		go func() { done <- serve(h, newRequest(step{keys: key("k1"), tenant: "t"})) }()
		<-started
		require.NoError(t, store.Delete(context.Background(), httpidem.StoreKey(prefix, "t", "k1")))
		select {
		case err := <-cause:
			assert.ErrorIs(t, err, idempotency.ErrLeaseLost)
		case <-time.After(30 * time.Second): // a hang guard, not a timing assertion
			t.Fatal("the handler's context was not cancelled after its lease was lost")
		}
		<-done
	})
}

// TestOuterHeadersNotReplayed: headers set by outer middleware belong to
// each request; only the handler's are stored and replayed. Over real HTTP,
// so that net/http's own header handling (sniffing, Content-Length) counts.
func TestOuterHeadersNotReplayed(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		var n atomic.Int64
		idem := newMiddleware(t, store, prefix, nil)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", strconv.FormatInt(n.Add(1), 10))
			w.Header().Set("Cache-Control", "no-cache")
			idem.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Cache-Control", "private") // overrides the outer value: the handler's
				w.WriteHeader(http.StatusAccepted)
				_, _ = io.WriteString(w, "<html>accepted</html>") // no Content-Type: net/http sniffs
			})).ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)

		first := post(t, srv, "/", "k1", "")
		again := post(t, srv, "/", "k1", "")
		assert.Equal(t, "1", first.header.Get("X-Request-Id"))
		assert.Equal(t, "2", again.header.Get("X-Request-Id"), "a replay keeps its own request id")
		want := first.header.Clone()
		want.Set("X-Request-Id", "2")
		want.Set(httpidem.ReplayedHeader, "true")
		assert.Equal(t, want, again.header)
		assert.Equal(t, "private", again.header.Get("Cache-Control"))
		assert.Equal(t, "text/html; charset=utf-8", again.header.Get("Content-Type"))
		assert.Equal(t, first.body, again.body)
		assert.Equal(t, http.StatusAccepted, again.status)
	})
}

// TestNilHeaderKept: a header set to nil (net/http: send none, do not sniff)
// stays nil in the replay.
func TestNilHeaderKept(t *testing.T) {
	store, prefix := storeKinds[0].New(t)
	srv := httptest.NewServer(newMiddleware(t, store, prefix, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil
		_, _ = io.WriteString(w, "<html>no type</html>")
	})))
	t.Cleanup(srv.Close)
	first := post(t, srv, "/", "k1", "")
	again := post(t, srv, "/", "k1", "")
	assert.Empty(t, first.header.Values("Content-Type"))
	assert.Empty(t, again.header.Values("Content-Type"))
	assert.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
	assert.Equal(t, first.body, again.body)
}

// TestHandlerSeesBody sends a 1 MiB body of unknown length over HTTP: the
// handler reads exactly what the client sent, after the middleware hashed it.
func TestHandlerSeesBody(t *testing.T) {
	store, prefix := storeKinds[0].New(t)
	h := newMiddleware(t, store, prefix, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, hex.EncodeToString(sum[:])+" "+strconv.Itoa(len(body)))
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	payload := strings.Repeat("0123456789abcdef", 1<<16)
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/", io.MultiReader(strings.NewReader(payload)))
	require.NoError(t, err)
	req.ContentLength = -1 // unknown: sent chunked
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(payload))
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, hex.EncodeToString(sum[:])+" "+strconv.Itoa(len(payload)), string(got))
}

// TestCorruptStoredResponse: a COMPLETED record that does not decode is a
// 500 problem, and the handler does not run again.
func TestCorruptStoredResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		store, prefix := kind.New(t)
		ctx := context.Background()
		skey, token := httpidem.StoreKey(prefix, "", "k1"), storekit.NewToken()
		_, err := store.Claim(ctx, skey, idempotency.ClaimRequest{Token: token, Lease: time.Minute, TTL: time.Minute})
		require.NoError(t, err)
		require.NoError(t, store.Complete(ctx, skey, token, []byte("not a response"), time.Minute))

		api := newPayments()
		got := serve(newMiddleware(t, store, prefix, nil).Handler(api), newRequest(step{keys: key("k1")}))
		requireProblem(t, got, http.StatusInternalServerError, storedResponseCorrupt)
		assert.Zero(t, api.runs.Load())
	})
}

// TestClientGoneHandlerReturnsNormally: a handler that did its effect and
// returned normally after its client left (here without writing anything:
// net/http's implicit 200) is COMPLETED with what it wrote, so the client's
// retry gets the replay and the effect runs once. Only a 5xx leaves the key
// FAILED for the retry to run again. Over real HTTP: the client really
// hangs up.
func TestClientGoneHandlerReturnsNormally(t *testing.T) {
	cases := []struct {
		name       string
		answer     int // 0: write nothing
		wantState  idempotency.State
		wantRetry  int
		wantEffect int64
	}{
		{name: "wrote nothing", answer: 0, wantState: idempotency.StateCompleted, wantRetry: http.StatusOK, wantEffect: 1},
		{name: "answered 201", answer: http.StatusCreated, wantState: idempotency.StateCompleted, wantRetry: http.StatusCreated, wantEffect: 1},
		{name: "answered 503", answer: http.StatusServiceUnavailable, wantState: idempotency.StateFailed, wantRetry: http.StatusServiceUnavailable, wantEffect: 2},
	}
	eachStore(t, func(t *testing.T, kind storeKind) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				store, prefix := kind.New(t)
				var effects atomic.Int64
				started, served := make(chan struct{}, 2), make(chan struct{}, 2)
				idem := newMiddleware(t, store, prefix, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					effects.Add(1) // the charge at the bank
					started <- struct{}{}
					if effects.Load() == 1 {
						<-r.Context().Done() // the bank is slow, and the client gives up
					}
					if tc.answer != 0 {
						w.WriteHeader(tc.answer)
					}
				}))
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					idem.ServeHTTP(w, r)
					served <- struct{}{} // the outcome is recorded
				}))
				t.Cleanup(srv.Close)

				ctx, cancel := context.WithCancel(context.Background())
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", nil)
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "k1")
				gone := make(chan error, 1)
				go func() {
					resp, err := srv.Client().Do(req)
					if err == nil {
						_ = resp.Body.Close()
					}
					gone <- err
				}()
				<-started
				cancel()
				require.Error(t, <-gone, "the client hung up before the answer")
				<-served

				rec, err := store.Get(context.Background(), httpidem.StoreKey(prefix, "", "k1"))
				require.NoError(t, err)
				assert.Equal(t, tc.wantState, rec.State)

				retry := post(t, srv, "/pay", "k1", "")
				<-served
				assert.Equal(t, tc.wantRetry, retry.status)
				if tc.wantState == idempotency.StateCompleted {
					assert.Equal(t, "true", retry.header.Get(httpidem.ReplayedHeader), "the retry is a replay")
				} else {
					assert.Empty(t, retry.header.Get(httpidem.ReplayedHeader))
				}
				assert.Equal(t, tc.wantEffect, effects.Load(), "effects")
			})
		}
	})
}

// TestClaimFailsAfterClientLeft: a claim that fails once the client is gone
// is still answered 503, never with net/http's empty 200.
func TestClaimFailsAfterClientLeft(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			store, prefix := storeKinds[0].New(t)
			api := newPayments()
			h := newMiddleware(t, store, prefix, func(c *config) { c.FailOpen = failOpen }).Handler(api)
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // memstore refuses a claim under a cancelled context
			got := serve(h, newRequest(step{keys: key("k1")}).WithContext(ctx))
			requireProblem(t, got, http.StatusServiceUnavailable, storeUnavailable)
			assert.Zero(t, api.runs.Load(), "nothing runs for a client that is gone")
		})
	}
}

// TestConnectionCutMidBody: a client whose connection breaks after part of
// the body and retries with the same key gets the whole response the
// handler wrote, not what the broken connection took. The handler writes
// 64 KiB, flushes, and writes the rest only once the server saw the cut (its
// context ended), in 4 KiB writes that stop at the first error, as io.Copy
// does. Over real connections: HTTP/1.1 reset by the client (TCP RST), and
// an HTTP/2 stream the client cancelled.
func TestConnectionCutMidBody(t *testing.T) {
	first, rest := bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("b"), 64<<10)
	cuts := []struct {
		name  string
		http2 bool
		// cut sends the request with key k1, reads 1 KiB of the body, and
		// breaks the connection.
		cut func(t *testing.T, srv *httptest.Server)
	}{
		{name: "HTTP/1.1 reset", cut: func(t *testing.T, srv *httptest.Server) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			require.NoError(t, err)
			_, err = io.WriteString(conn, "POST /download HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\nContent-Length: 0\r\n\r\n")
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			_, err = io.ReadFull(resp.Body, make([]byte, 1024))
			require.NoError(t, err, "part of the body arrives")
			require.NoError(t, conn.(*net.TCPConn).SetLinger(0)) // Close sends a reset
			require.NoError(t, conn.Close())
		}},
		{name: "HTTP/2 stream cancelled", http2: true, cut: func(t *testing.T, srv *httptest.Server) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/download", nil)
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "k1")
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			require.Equal(t, 2, resp.ProtoMajor)
			_, err = io.ReadFull(resp.Body, make([]byte, 1024))
			require.NoError(t, err, "part of the body arrives")
			cancel() // RST_STREAM
		}},
	}
	eachStore(t, func(t *testing.T, kind storeKind) {
		for _, tc := range cuts {
			t.Run(tc.name, func(t *testing.T) {
				store, prefix := kind.New(t)
				var runs atomic.Int64
				idem := newMiddleware(t, store, prefix, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					w.Header().Set("Content-Type", "application/octet-stream")
					_, _ = w.Write(first)
					http.NewResponseController(w).Flush()
					<-r.Context().Done() // the client broke the connection
					for chunk := range slices.Chunk(rest, 4<<10) {
						if _, err := w.Write(chunk); err != nil {
							return
						}
					}
				}))
				served := make(chan struct{}, 2)
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					idem.ServeHTTP(w, r)
					served <- struct{}{} // the outcome is recorded
				}))
				if tc.http2 {
					srv.EnableHTTP2 = true
					srv.StartTLS()
				} else {
					srv.Start()
				}
				t.Cleanup(srv.Close)

				tc.cut(t, srv)
				<-served
				retry := post(t, srv, "/download", "k1", "")
				<-served
				assert.Equal(t, http.StatusOK, retry.status)
				assert.Equal(t, "true", retry.header.Get(httpidem.ReplayedHeader))
				assert.Equal(t, len(first)+len(rest), len(retry.body), "the replay's length")
				assert.True(t, retry.body == string(first)+string(rest), "the replay is what the handler wrote")
				assert.EqualValues(t, 1, runs.Load())
			})
		}
	})
}

// TestHandlerWriteErrorsReachTheHandler: a write that net/http refuses for
// what the handler wrote (more than its declared Content-Length) fails for
// the handler under the middleware too, over HTTP/1.1 and HTTP/2 alike, so
// that it can abort: panicking with http.ErrAbortHandler leaves the key
// FAILED, and the retry runs the handler again. Only a write to a broken
// connection is recorded and reported as written.
func TestHandlerWriteErrorsReachTheHandler(t *testing.T) {
	for _, http2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", http2), func(t *testing.T) {
			store, prefix := storeKinds[0].New(t)
			var runs atomic.Int64
			writeErrs := make(chan error, 2)
			idem := newMiddleware(t, store, prefix, nil).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if n > 1 {
					_, _ = io.WriteString(w, "fixed")
					return
				}
				w.Header().Set("Content-Length", "5")
				_, _ = io.WriteString(w, "hello")
				http.NewResponseController(w).Flush() // HTTP/2 checks the length of what follows
				_, err := io.WriteString(w, " world")
				writeErrs <- err
				if err != nil {
					panic(http.ErrAbortHandler)
				}
			}))
			served := make(chan struct{}, 2)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { served <- struct{}{} }()
				idem.ServeHTTP(w, r)
			}))
			srv.Config.ErrorLog = log.New(io.Discard, "", 0)
			if http2 {
				srv.EnableHTTP2 = true
				srv.StartTLS()
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)

			req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", nil)
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "k-over-length")
			if resp, err := srv.Client().Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			<-served
			require.Error(t, <-writeErrs, "a write beyond Content-Length fails, as without the middleware")

			retry := post(t, srv, "/pay", "k-over-length", "")
			<-served
			assert.Equal(t, "fixed", retry.body, "the aborted run left the key FAILED: the retry ran")
			assert.EqualValues(t, 2, runs.Load())
		})
	}
}
