package httpidem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
)

// attempts records what a Transport's OnAttempt sees.
type attempts struct {
	mu   sync.Mutex
	list []httpidem.Attempt
	then func(httpidem.Attempt) // if set, called after each is recorded
}

func (a *attempts) record(at httpidem.Attempt) {
	a.mu.Lock()
	a.list = append(a.list, at)
	then := a.then
	a.mu.Unlock()
	if then != nil {
		then(at)
	}
}

func (a *attempts) all() []httpidem.Attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]httpidem.Attempt(nil), a.list...)
}

func (a *attempts) verdicts() []httpidem.Verdict {
	var v []httpidem.Verdict
	for _, at := range a.all() {
		v = append(v, at.Verdict)
	}
	return v
}

// newTransport returns a Transport on a fresh http.Transport (its own
// connections), with 1 ms backoff steps unless adjust says otherwise, and
// what it records of every attempt.
func newTransport(t *testing.T, adjust func(*httpidem.Transport)) (*httpidem.Transport, *attempts) {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	rec := &attempts{}
	tr := &httpidem.Transport{Base: base, Backoff: time.Millisecond}
	httpidem.Observe(tr, rec.record)
	if adjust != nil {
		adjust(tr)
	}
	return tr, rec
}

// paymentsServer serves the payments handler behind the middleware on
// kind's store, and returns it with a fault proxy in front of it.
func paymentsServer(t *testing.T, kind storeKind) (*payments, *httptest.Server, *testserver.FaultProxy) {
	t.Helper()
	store, prefix := kind.New(t)
	api := newPayments()
	srv := httptest.NewServer(newMiddleware(t, store, prefix, nil).Handler(api))
	t.Cleanup(srv.Close)
	return api, srv, testserver.StartFaultProxy(t, srv.Listener.Addr().String())
}

// call sends one request through tr and reads its answer; Date is
// dropped.
func call(t *testing.T, tr http.RoundTripper, req *http.Request) (answer, *http.Response, error) {
	t.Helper()
	req.Header.Set("X-Tenant", "tenant-a")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return answer{}, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, string(b)}, resp, nil
}

func newPost(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	return req
}

// requireOneKey checks that every attempt sent the same key, the one the
// response's request carries, and returns it.
func requireOneKey(t *testing.T, rec *attempts, resp *http.Response) string {
	t.Helper()
	key := resp.Request.Header.Get("Idempotency-Key")
	require.NotEmpty(t, key, "the response's request carries the key")
	for _, at := range rec.all() {
		require.Equal(t, key, at.Key, "attempt %d", at.Number)
		require.Equal(t, key, at.Request.Header.Get("Idempotency-Key"), "attempt %d sent it", at.Number)
	}
	return key
}

// TestTransportLostResponse: the proxy resets the connection in the middle
// of the first answer, after the handler ran. The Transport sends the call
// again with the same key and gets the replay; the handler ran once.
func TestTransportLostResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, _, proxy := paymentsServer(t, kind)
		tr, rec := newTransport(t, nil)
		proxy.ResetMidReply()

		got, resp, err := call(t, tr, newPost(t, context.Background(), "http://"+proxy.Addr+"/pay", `{"amount":100}`))
		require.NoError(t, err)
		assert.Equal(t, 1, proxy.Resets(), "the first answer was cut")
		assert.Equal(t, http.StatusCreated, got.status, got.body)
		assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader), "the retry got the stored answer")
		assert.Contains(t, got.body, `"run":1,`)
		assert.EqualValues(t, 1, api.runs.Load(), "handler runs")
		key := requireOneKey(t, rec, resp)
		assert.Len(t, key, 36, "a UUID")

		all := rec.all()
		require.GreaterOrEqual(t, len(all), 2)
		assert.Error(t, all[0].Err, "the first attempt lost its answer")
		t.Logf("attempt 1: %v", all[0].Err)
		assert.Equal(t, httpidem.VerdictRetry, all[0].Verdict)
		last := all[len(all)-1]
		assert.Equal(t, httpidem.VerdictDone, last.Verdict)
		assert.True(t, last.Replayed)
	})
}

// TestTransportRetriesWhileInProgress: a call is sent while the first
// request with its key still runs. It gets 409 with Retry-After, waits
// that long (1 s, the server's default), and then gets the replay; the
// handler ran once.
func TestTransportRetriesWhileInProgress(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, srv, _ := paymentsServer(t, kind)
		const key = "in-progress-key"
		first := make(chan answer, 1)
		go func() {
			req := newPost(t, context.Background(), srv.URL+"/block", `{"amount":100}`)
			req.Header.Set("Idempotency-Key", key)
			a, _, err := call(t, http.DefaultTransport, req)
			assert.NoError(t, err)
			first <- a
		}()
		require.Equal(t, key, <-api.started)

		var original answer
		tr, rec := newTransport(t, nil)
		rec.then = func(a httpidem.Attempt) {
			if a.Status == http.StatusConflict && a.Number == 1 {
				close(api.release) // the first run ends during the pause
				original = <-first
			}
		}
		got, resp, err := call(t, tr, newPost(t, httpidem.WithKey(context.Background(), key), srv.URL+"/block", `{"amount":100}`))
		require.NoError(t, err)
		assert.Equal(t, key, requireOneKey(t, rec, resp), "the key of the context")

		all := rec.all()
		require.Len(t, all, 2)
		assert.Equal(t, http.StatusConflict, all[0].Status)
		assert.Equal(t, httpidem.VerdictRetry, all[0].Verdict)
		assert.Equal(t, time.Second, all[0].Wait, "Retry-After: 1")
		assert.Equal(t, http.StatusCreated, got.status)
		assert.True(t, all[1].Replayed)
		assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
		assert.Equal(t, original.body, got.body)
		assert.EqualValues(t, 1, api.runs.Load(), "handler runs")
	})
}

// TestTransportFinalClientErrors: 400 and 422 are final: returned at once,
// after one attempt.
func TestTransportFinalClientErrors(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, srv, _ := paymentsServer(t, kind)
		ctx := httpidem.WithKey(context.Background(), "final-key")

		t.Run("400 from the handler", func(t *testing.T) {
			tr, rec := newTransport(t, nil)
			got, _, err := call(t, tr, newPost(t, context.Background(), srv.URL+"/bad", `{}`))
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadRequest, got.status)
			assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
		})
		t.Run("400 for an invalid key of the caller's", func(t *testing.T) {
			tr, rec := newTransport(t, nil)
			req := newPost(t, context.Background(), srv.URL+"/pay", `{}`)
			req.Header.Set("Idempotency-Key", "k1, k2")
			got, resp, err := call(t, tr, req)
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadRequest, got.status)
			assert.Equal(t, "k1, k2", resp.Request.Header.Get("Idempotency-Key"), "the caller's key is kept")
			assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
		})
		t.Run("422 for the key reused", func(t *testing.T) {
			tr, rec := newTransport(t, nil)
			got, _, err := call(t, tr, newPost(t, ctx, srv.URL+"/pay", `{"amount":1}`))
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, got.status)
			got, _, err = call(t, tr, newPost(t, ctx, srv.URL+"/pay", `{"amount":2}`))
			require.NoError(t, err)
			assert.Equal(t, http.StatusUnprocessableEntity, got.status)
			assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone, httpidem.VerdictDone}, rec.verdicts())
		})
		assert.EqualValues(t, 2, api.runs.Load(), "/bad and the first /pay ran, once each")
	})
}

// TestTransportBackoffBounded: a handler that keeps failing (503, no
// Retry-After) is retried with exponential backoff until MaxAttempts; the
// last 503 goes to the caller.
func TestTransportBackoffBounded(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, srv, _ := paymentsServer(t, kind)
		tr, rec := newTransport(t, func(c *httpidem.Transport) {
			c.MaxAttempts = 4
			c.Backoff = 2 * time.Millisecond
			c.MaxWait = 5 * time.Millisecond
		})
		got, _, err := call(t, tr, newPost(t, context.Background(), srv.URL+"/fail", `{"amount":1}`))
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, got.status)
		assert.Contains(t, got.body, "run 4")
		assert.EqualValues(t, 4, api.runs.Load(), "each retry ran the failed call again")
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry, httpidem.VerdictRetry, httpidem.VerdictRetry, httpidem.VerdictExhausted}, rec.verdicts())
		steps := []time.Duration{2 * time.Millisecond, 4 * time.Millisecond, 5 * time.Millisecond}
		for i, at := range rec.all()[:3] {
			assert.GreaterOrEqual(t, at.Wait, steps[i]/2, "pause %d", i+1)
			assert.LessOrEqual(t, at.Wait, steps[i], "pause %d", i+1)
		}
	})
}

// TestTransportContextDeadline: a pause that would end after the request's
// deadline is not taken: the 503 goes to the caller at once. A context
// that ends during a pause ends the call with its cause.
func TestTransportContextDeadline(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, srv, _ := paymentsServer(t, kind)
		slow := func(c *httpidem.Transport) { c.Backoff, c.MaxWait = time.Hour, time.Hour }

		t.Run("pause past the deadline", func(t *testing.T) {
			tr, rec := newTransport(t, slow)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got, _, err := call(t, tr, newPost(t, ctx, srv.URL+"/fail", `{"amount":1}`))
			require.NoError(t, err)
			assert.Equal(t, http.StatusServiceUnavailable, got.status)
			assert.Equal(t, []httpidem.Verdict{httpidem.VerdictTooLong}, rec.verdicts())
		})
		t.Run("context ends during the pause", func(t *testing.T) {
			tr, rec := newTransport(t, slow)
			ctx, cancel := context.WithCancelCause(context.Background())
			errGone := errors.New("the caller left")
			rec.then = func(httpidem.Attempt) { cancel(errGone) }
			_, _, err := call(t, tr, newPost(t, ctx, srv.URL+"/fail", `{"amount":1}`))
			require.ErrorIs(t, err, errGone)
			var ce *httpidem.CallError
			require.ErrorAs(t, err, &ce)
			assert.Len(t, rec.all(), 1, "attempts")
			assert.Len(t, ce.Key, 36)
			assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry}, rec.verdicts())
		})
		assert.EqualValues(t, 2, api.runs.Load())
	})
}

// onceReader is a request body that cannot be rewound.
type onceReader struct{ io.Reader }

func (onceReader) Close() error { return nil }

// TestTransportBodyNotRewindable: a request whose body has no GetBody is
// sent once, never again: a lost answer is the caller's error, a 503 its
// answer.
func TestTransportBodyNotRewindable(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, _, proxy := paymentsServer(t, kind)
		newReq := func(path string) *http.Request {
			req, err := http.NewRequest(http.MethodPost, "http://"+proxy.Addr+path, onceReader{strings.NewReader(`{"amount":1}`)})
			require.NoError(t, err)
			require.Nil(t, req.GetBody)
			return req
		}

		tr, rec := newTransport(t, nil)
		proxy.ResetMidReply()
		_, _, err := call(t, tr, newReq("/pay"))
		require.Error(t, err)
		var ce *httpidem.CallError
		require.ErrorAs(t, err, &ce)
		assert.Len(t, rec.all(), 1, "attempts")
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictUnsafe}, rec.verdicts())

		tr, rec = newTransport(t, nil)
		got, _, err := call(t, tr, newReq("/fail"))
		require.NoError(t, err)
		assert.Equal(t, http.StatusServiceUnavailable, got.status)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictUnsafe}, rec.verdicts())
		assert.EqualValues(t, 2, api.runs.Load(), "each request ran once")
	})
}

// TestTransportConcurrentLossyLink: 64 goroutines each make one call
// through a proxy that cuts 32 answers. Every call gets its 201, and every
// effect happened once.
func TestTransportConcurrentLossyLink(t *testing.T) {
	const calls, cuts = 64, 32
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, _, proxy := paymentsServer(t, kind)
		tr, rec := newTransport(t, func(c *httpidem.Transport) { c.MaxAttempts = 20 })
		for range cuts {
			proxy.ResetMidReply()
		}
		var wg sync.WaitGroup
		bodies := make([]string, calls)
		for i := range calls {
			wg.Go(func() {
				got, _, err := call(t, tr, newPost(t, context.Background(), "http://"+proxy.Addr+"/pay", `{"call":`+strconv.Itoa(i)+`}`))
				if assert.NoError(t, err, "call %d", i) && assert.Equal(t, http.StatusCreated, got.status, "call %d: %s", i, got.body) {
					bodies[i] = got.body
				}
			})
		}
		wg.Wait()
		assert.Equal(t, cuts, proxy.Resets(), "every armed cut happened")
		assert.EqualValues(t, calls, api.runs.Load(), "handler runs: one per call")
		runs := map[string]bool{}
		for i, b := range bodies {
			assert.Contains(t, b, `\"call\":`+strconv.Itoa(i)+`}`, "call %d got its own answer", i)
			run, _, _ := strings.Cut(b, ",")
			assert.False(t, runs[run], "call %d: run %s answered twice", i, run)
			runs[run] = true
		}
		var replays, retries int
		keys := map[string]bool{}
		for _, at := range rec.all() {
			keys[at.Key] = true
			if at.Replayed {
				replays++
			}
			if at.Verdict == httpidem.VerdictRetry {
				retries++
			}
		}
		assert.Len(t, keys, calls, "one key per call")
		assert.GreaterOrEqual(t, retries, cuts, "every cut answer was retried")
		t.Logf("%d attempts, %d retries, %d replays", len(rec.all()), retries, replays)
	})
}

// TestTransportBodyCutAfterHeaders: an answer cut after its headers
// arrived is the caller's, as the Transport has returned it by then:
// reading its body fails. The caller retries the call itself with the key
// read back from the response's request, and gets the replay; the handler
// ran once.
func TestTransportBodyCutAfterHeaders(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		api, _, proxy := paymentsServer(t, kind)
		tr, rec := newTransport(t, nil)
		client := &http.Client{Transport: tr}
		proxy.ResetMidReply() // half of a 2 KiB answer: its headers and part of its body

		req := newPost(t, context.Background(), "http://"+proxy.Addr+"/big", `{"amount":1}`)
		req.Header.Set("X-Tenant", "tenant-a")
		resp, err := client.Do(req)
		require.NoError(t, err, "the headers arrived")
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
		_, err = io.ReadAll(resp.Body)
		require.Error(t, err, "the body was cut")
		_ = resp.Body.Close()
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
		key := resp.Request.Header.Get("Idempotency-Key")

		got, again, err := call(t, tr, newPost(t, httpidem.WithKey(context.Background(), key), "http://"+proxy.Addr+"/big", `{"amount":1}`))
		require.NoError(t, err)
		assert.Equal(t, key, again.Request.Header.Get("Idempotency-Key"))
		assert.Equal(t, http.StatusCreated, got.status)
		assert.Equal(t, "true", got.header.Get(httpidem.ReplayedHeader))
		assert.Len(t, got.body, 2048)
		assert.EqualValues(t, 1, api.runs.Load(), "handler runs")
	})
}
