package httpidem_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	"github.com/idempotency/watermill-idempotency/middleware/internal/adaptertest"
)

// reply is one scripted answer: a status and its headers.
type reply struct {
	status int
	header map[string]string
}

// scripted is a server that answers its requests with the replies in
// order (the last one again once they run out), and records what each
// request carried.
type scripted struct {
	replies []reply
	mu      sync.Mutex
	keys    []string
	bodies  []string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.keys)
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	s.bodies = append(s.bodies, string(body))
	s.mu.Unlock()
	rep := s.replies[min(n, len(s.replies)-1)]
	for k, v := range rep.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, "answer "+strconv.Itoa(n+1))
}

func (s *scripted) requests() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]string(nil), s.bodies...)
}

func startScripted(t *testing.T, replies ...reply) (*scripted, string) {
	t.Helper()
	s := &scripted{replies: replies}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func ra(status int, retryAfter string) reply {
	return reply{status: status, header: map[string]string{"Retry-After": retryAfter}}
}

// closeTracker wraps a RoundTripper and counts, per response, whether its
// body was closed.
type closeTracker struct {
	base   http.RoundTripper
	mu     sync.Mutex
	bodies []*trackedBody
}

type trackedBody struct {
	io.ReadCloser
	closed atomic.Bool
}

func (b *trackedBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

func (c *closeTracker) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	if err == nil {
		b := &trackedBody{ReadCloser: resp.Body}
		resp.Body = b
		c.mu.Lock()
		c.bodies = append(c.bodies, b)
		c.mu.Unlock()
	}
	return resp, err
}

func (c *closeTracker) closed() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []bool
	for _, b := range c.bodies {
		out = append(out, b.closed.Load())
	}
	return out
}

// do sends req through tr and returns the response, its body read and
// closed.
func do(t *testing.T, tr http.RoundTripper, req *http.Request) (*http.Response, string, error) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, rerr := io.ReadAll(resp.Body)
	require.NoError(t, rerr)
	require.NoError(t, resp.Body.Close())
	return resp, string(b), nil
}

func TestTransportRetryAfter(t *testing.T) {
	cases := []struct {
		name     string
		first    reply
		verdict  httpidem.Verdict
		min, max time.Duration // bounds of the pause, when retried
	}{
		{name: "seconds", first: ra(503, "2"), verdict: httpidem.VerdictRetry, min: 2 * time.Second, max: 2 * time.Second},
		{name: "429 seconds", first: ra(429, "3"), verdict: httpidem.VerdictRetry, min: 3 * time.Second, max: 3 * time.Second},
		{name: "409 seconds", first: ra(409, "1"), verdict: httpidem.VerdictRetry, min: time.Second, max: time.Second},
		{name: "zero", first: ra(503, "0"), verdict: httpidem.VerdictRetry},
		{name: "HTTP-date", first: ra(429, time.Now().Add(20*time.Second).UTC().Format(http.TimeFormat)),
			verdict: httpidem.VerdictRetry, min: 10 * time.Second, max: 20 * time.Second}, // room for a slow machine
		{name: "HTTP-date in the past", first: ra(503, "Sun, 06 Nov 1994 08:49:37 GMT"), verdict: httpidem.VerdictRetry},
		{name: "over MaxRetryAfter", first: ra(503, "31"), verdict: httpidem.VerdictTooLong},
		{name: "a day", first: ra(429, "86400"), verdict: httpidem.VerdictTooLong},
		{name: "overflowing", first: ra(503, "99999999999999999999999"), verdict: httpidem.VerdictTooLong},
		{name: "far date", first: ra(503, "Fri, 31 Dec 9999 23:59:59 GMT"), verdict: httpidem.VerdictTooLong},
		{name: "negative: backoff", first: ra(503, "-1"), verdict: httpidem.VerdictRetry, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{name: "garbage: backoff", first: ra(429, "soon"), verdict: httpidem.VerdictRetry, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{name: "409 garbage: backoff", first: ra(409, "1.5"), verdict: httpidem.VerdictRetry, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{name: "429 without: backoff", first: reply{status: 429}, verdict: httpidem.VerdictRetry, min: 50 * time.Millisecond, max: 100 * time.Millisecond},
		{name: "409 without: final", first: reply{status: 409}, verdict: httpidem.VerdictDone},
		{name: "501: final", first: ra(501, "1"), verdict: httpidem.VerdictDone},
		{name: "404: final", first: ra(404, "1"), verdict: httpidem.VerdictDone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, url := startScripted(t, c.first, reply{status: 201})
			tr, rec := newTransport(t, func(cfg *httpidem.Transport) {
				cfg.Backoff, cfg.MaxWait = 100*time.Millisecond, 30*time.Second
			})
			// The pauses are checked, not taken: the context ends as soon
			// as the Transport has decided.
			ctx, cancel := context.WithCancel(context.Background())
			rec.then = func(a httpidem.Attempt) {
				if a.Number == 1 && a.Wait > 0 {
					cancel()
				}
			}
			defer cancel()
			resp, body, err := do(t, tr, newPost(t, ctx, url, "{}"))
			all := rec.all()
			require.NotEmpty(t, all)
			assert.Equal(t, c.verdict, all[0].Verdict)
			keys, _ := s.requests()
			switch {
			case c.verdict != httpidem.VerdictRetry:
				require.NoError(t, err)
				assert.Equal(t, c.first.status, resp.StatusCode, "the first answer goes to the caller")
				assert.Equal(t, "answer 1", body)
				assert.Len(t, keys, 1)
			case c.max > 0:
				require.ErrorIs(t, err, context.Canceled)
				assert.GreaterOrEqual(t, all[0].Wait, c.min)
				assert.LessOrEqual(t, all[0].Wait, c.max)
			default:
				require.NoError(t, err)
				assert.Equal(t, 201, resp.StatusCode)
				assert.Zero(t, all[0].Wait)
				require.Len(t, keys, 2)
				assert.Equal(t, keys[0], keys[1], "one key")
			}
		})
	}
}

// TestTransportMethodsAndKeys: which requests get a key, which keep
// theirs, and which may be retried without one.
func TestTransportMethodsAndKeys(t *testing.T) {
	fail := reply{status: 503}
	cases := []struct {
		name, method, key string
		ctxKey            string
		methods           []string
		wantKey           string // "uuid" for a fresh one
		retried           bool
	}{
		{name: "POST gets a key", method: "POST", wantKey: "uuid", retried: true},
		{name: "PATCH gets a key", method: "PATCH", wantKey: "uuid", retried: true},
		{name: "POST keeps the caller's key", method: "POST", key: "mine", wantKey: "mine", retried: true},
		{name: "the caller's key wins over the context's", method: "POST", key: "mine", ctxKey: "ctx", wantKey: "mine", retried: true},
		{name: "POST takes the context's key", method: "POST", ctxKey: "ctx", wantKey: "ctx", retried: true},
		{name: "GET gets no key, is idempotent", method: "GET", ctxKey: "ctx", retried: true},
		{name: "GET keeps the caller's key", method: "GET", key: "mine", wantKey: "mine", retried: true},
		{name: "PUT is idempotent", method: "PUT", retried: true},
		{name: "DELETE is idempotent", method: "DELETE", retried: true},
		{name: "a method of its own without a key", method: "CHARGE", retried: false},
		{name: "a method of its own with a key", method: "CHARGE", key: "mine", wantKey: "mine", retried: true},
		{name: "POST not in Methods", method: "POST", methods: []string{"PATCH"}, retried: false},
		{name: "POST not in Methods, with a key", method: "POST", methods: []string{"PATCH"}, key: "mine", wantKey: "mine", retried: true},
		{name: "a method of its own in Methods", method: "CHARGE", methods: []string{"CHARGE"}, wantKey: "uuid", retried: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, url := startScripted(t, fail)
			tr, rec := newTransport(t, func(cfg *httpidem.Transport) { cfg.Methods, cfg.MaxAttempts = c.methods, 3 })
			ctx := httpidem.WithKey(context.Background(), c.ctxKey)
			req, err := http.NewRequestWithContext(ctx, c.method, url, strings.NewReader("body"))
			require.NoError(t, err)
			if c.key != "" {
				req.Header.Set("Idempotency-Key", c.key)
			}
			resp, _, err := do(t, tr, req)
			require.NoError(t, err)
			assert.Equal(t, 503, resp.StatusCode)
			assert.Equal(t, c.key, req.Header.Get("Idempotency-Key"), "the caller's request is left as it was")

			keys, bodies := s.requests()
			sent := resp.Request.Header.Get("Idempotency-Key")
			switch c.wantKey {
			case "uuid":
				assert.Len(t, sent, 36)
			default:
				assert.Equal(t, c.wantKey, sent)
			}
			if c.retried {
				assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry, httpidem.VerdictRetry, httpidem.VerdictExhausted}, rec.verdicts())
				assert.Equal(t, []string{sent, sent, sent}, keys, "every attempt sends the same key")
				assert.Equal(t, []string{"body", "body", "body"}, bodies, "the body is rewound")
			} else {
				assert.Equal(t, []httpidem.Verdict{httpidem.VerdictUnsafe}, rec.verdicts())
				assert.Equal(t, []string{sent}, keys)
			}
		})
	}
}

// TestTransportClosesRetriedBodies: every response that is retried is
// closed by the Transport; the last one is the caller's.
func TestTransportClosesRetriedBodies(t *testing.T) {
	_, url := startScripted(t, reply{status: 503}, ra(429, "0"), ra(409, "0"), reply{status: 201})
	tracker := &closeTracker{base: &http.Transport{}}
	tr, rec := newTransport(t, func(c *httpidem.Transport) { c.Base = tracker })
	resp, err := tr.RoundTrip(newPost(t, context.Background(), url, "{}"))
	require.NoError(t, err)
	assert.Equal(t, 201, resp.StatusCode)
	assert.Len(t, rec.all(), 4)
	assert.Equal(t, []bool{true, true, true, false}, tracker.closed())
	require.NoError(t, resp.Body.Close())
}

// errBodyGone is the error of a GetBody that fails.
var errBodyGone = errors.New("body gone")

// TestTransportBodies: a body already read, and a GetBody that fails.
func TestTransportBodies(t *testing.T) {
	t.Run("already read", func(t *testing.T) {
		s, url := startScripted(t, reply{status: 201})
		tr, rec := newTransport(t, nil)
		req := newPost(t, context.Background(), url, `{"amount":1}`)
		_, err := io.ReadAll(req.Body)
		require.NoError(t, err)
		resp, _, err := do(t, tr, req)
		require.NoError(t, err, "the retry sends the body GetBody gives")
		assert.Equal(t, 201, resp.StatusCode)
		_, bodies := s.requests()
		assert.Equal(t, []string{`{"amount":1}`}, bodies, "the truncated first attempt never reached the handler")
		verdicts := rec.verdicts()
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry, httpidem.VerdictDone}, verdicts)
	})
	t.Run("GetBody fails", func(t *testing.T) {
		s, url := startScripted(t, reply{status: 503}, reply{status: 201})
		tr, rec := newTransport(t, nil)
		req := newPost(t, context.Background(), url, `{"amount":1}`)
		req.GetBody = func() (io.ReadCloser, error) { return nil, errBodyGone }
		resp, body, err := do(t, tr, req)
		require.NoError(t, err)
		assert.Equal(t, 503, resp.StatusCode, "the last answer, since the body cannot be sent again")
		assert.Equal(t, "answer 1", body)
		keys, _ := s.requests()
		assert.Len(t, keys, 1)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictUnsafe}, rec.verdicts())
	})
}

// TestTransportErrors: what is retried when no response comes.
func TestTransportErrors(t *testing.T) {
	t.Run("connection refused", func(t *testing.T) {
		tr, rec := newTransport(t, func(c *httpidem.Transport) { c.MaxAttempts = 3 })
		url := "http://127.0.0.1:" + strconv.Itoa(testserver.FreePort(t)) + "/pay"
		_, _, err := do(t, tr, newPost(t, context.Background(), url, "{}"))
		var ce *httpidem.CallError
		require.ErrorAs(t, err, &ce)
		assert.Len(t, rec.all(), 3, "attempts")
		assert.Len(t, ce.Key, 36)
		assert.Contains(t, err.Error(), ce.Key)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictRetry, httpidem.VerdictRetry, httpidem.VerdictExhausted}, rec.verdicts())
	})
	t.Run("refused before the network", func(t *testing.T) {
		tr, rec := newTransport(t, nil)
		_, _, err := do(t, tr, newPost(t, context.Background(), "ftp://127.0.0.1/pay", "{}"))
		require.Error(t, err)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
	})
	t.Run("a key that would split the header", func(t *testing.T) {
		s, url := startScripted(t, reply{status: 201})
		tr, rec := newTransport(t, nil)
		ctx := httpidem.WithKey(context.Background(), "k\r\nX-Injected: 1")
		_, _, err := do(t, tr, newPost(t, ctx, url, "{}"))
		require.Error(t, err)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts(), "net/http refuses it before the network")
		keys, _ := s.requests()
		assert.Empty(t, keys)
	})
	t.Run("certificate refused", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		t.Cleanup(srv.Close)
		tr, rec := newTransport(t, nil) // its base does not trust the test server's certificate
		_, _, err := do(t, tr, newPost(t, context.Background(), srv.URL, "{}"))
		var verr *tls.CertificateVerificationError
		require.ErrorAs(t, err, &verr)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
	})
	t.Run("TLS to a server that does not speak it", func(t *testing.T) {
		_, url := startScripted(t, reply{status: 201})
		tr, rec := newTransport(t, nil)
		_, _, err := do(t, tr, newPost(t, context.Background(), strings.Replace(url, "http://", "https://", 1), "{}"))
		var rerr tls.RecordHeaderError
		require.ErrorAs(t, err, &rerr)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
	})
	t.Run("context already ended", func(t *testing.T) {
		_, url := startScripted(t, reply{status: 201})
		tr, rec := newTransport(t, nil)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _, err := do(t, tr, newPost(t, ctx, url, "{}"))
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
	})
}

// TestTransportRefusesBadConfig: every call of a Transport with bad fields
// fails with all of its problems, before anything is sent.
func TestTransportRefusesBadConfig(t *testing.T) {
	tr := &httpidem.Transport{MaxAttempts: -1, Backoff: -1, MaxWait: -1,
		Header: "Bad Header", Methods: []string{"POST", "NOT A METHOD"}, Base: roundTripperFunc(func(*http.Request) (*http.Response, error) {
			t.Error("a bad Transport sent a request")
			return nil, errors.New("sent")
		})}
	want := strings.Join([]string{
		"httpidem: invalid config: MaxAttempts is -1, must not be negative",
		"httpidem: invalid config: Backoff is -1ns, must not be negative",
		"httpidem: invalid config: MaxWait is -1ns, must not be negative",
		`httpidem: invalid config: Header "Bad Header" is not a header name`,
		`httpidem: invalid config: method "NOT A METHOD" is not a method name`,
	}, "\n")
	for range 2 {
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodPost, "http://127.0.0.1/pay", nil))
		adaptertest.RequireProblems(t, err, want, httpidem.ErrInvalidConfig, nil)
	}
}

// roundTripperFunc is a RoundTripper that breaks its contract on purpose.
type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestTransportOddRequestsAndBases: requests built by hand, and base
// RoundTrippers that break their contract, get an answer, not a panic.
func TestTransportOddRequestsAndBases(t *testing.T) {
	t.Run("nil Header", func(t *testing.T) {
		s, url := startScripted(t, reply{status: 201})
		tr, _ := newTransport(t, nil)
		req := newPost(t, context.Background(), url, "{}")
		req.Header = nil
		resp, _, err := do(t, tr, req)
		require.NoError(t, err)
		assert.Equal(t, 201, resp.StatusCode)
		keys, _ := s.requests()
		assert.Len(t, keys[0], 36)
		assert.Nil(t, req.Header, "the caller's request is left as it was")
	})
	t.Run("key under a spelling not canonical", func(t *testing.T) {
		s, url := startScripted(t, reply{status: 201})
		tr, rec := newTransport(t, nil)
		req := newPost(t, context.Background(), url, "{}")
		req.Header["idempotency-key"] = []string{"mine"}
		_, _, err := do(t, tr, req)
		require.NoError(t, err)
		keys, _ := s.requests()
		assert.Equal(t, []string{"mine"}, keys, "the caller's key is the only one sent")
		assert.Equal(t, "mine", rec.all()[0].Key)
	})
	t.Run("base returns nothing", func(t *testing.T) {
		tr, rec := newTransport(t, func(c *httpidem.Transport) {
			c.Base = roundTripperFunc(func(*http.Request) (*http.Response, error) { return nil, nil })
		})
		_, _, err := do(t, tr, newPost(t, context.Background(), "http://127.0.0.1:1/", "{}"))
		require.Error(t, err)
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
	})
	t.Run("base returns a response and an error", func(t *testing.T) {
		body := &trackedBody{ReadCloser: io.NopCloser(strings.NewReader("x"))}
		tr, rec := newTransport(t, func(c *httpidem.Transport) {
			c.Base = roundTripperFunc(func(*http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 200, Body: body, Header: http.Header{}}, errBodyGone
			})
		})
		resp, _, err := do(t, tr, newPost(t, context.Background(), "http://127.0.0.1:1/", "{}"))
		require.ErrorIs(t, err, errBodyGone)
		assert.Nil(t, resp)
		assert.True(t, body.closed.Load(), "the response beside the error is closed")
		assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
	})
}

// TestTransportTimeoutSeenThrough: a call that ends with its context's
// deadline is a timeout to url.Error.Timeout, as without the Transport,
// and names its key.
func TestTransportTimeoutSeenThrough(t *testing.T) {
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) }) // before srv.Close
	tr, rec := newTransport(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := (&http.Client{Transport: tr}).Do(newPost(t, ctx, srv.URL, "{}"))
	var uerr *url.Error
	require.ErrorAs(t, err, &uerr)
	assert.True(t, uerr.Timeout(), "%v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ce *httpidem.CallError
	require.ErrorAs(t, err, &ce)
	assert.Len(t, ce.Key, 36)
	assert.Equal(t, []httpidem.Verdict{httpidem.VerdictDone}, rec.verdicts())
}
