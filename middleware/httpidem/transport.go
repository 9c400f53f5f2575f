package httpidem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// Transport is an [http.RoundTripper] that sends each POST and PATCH with
// one idempotency key, and retries it with the same key. The zero Transport
// is ready to use. It is safe for concurrent use; its fields must not
// change after its first call.
type Transport struct {
	// Base sends each attempt. The default is [http.DefaultTransport].
	Base http.RoundTripper

	// Header carries the key; it must be the server's [Config].Header.
	// The default is "Idempotency-Key".
	Header string

	// Methods get a key when they have none. The default is POST and PATCH.
	Methods []string

	// MaxAttempts bounds the attempts of one call; 1 sends it once.
	// The default is 5.
	MaxAttempts int

	// Backoff is the first pause without a Retry-After; it doubles for
	// each retry, with jitter. The default is 200 ms.
	Backoff time.Duration

	// MaxWait caps every pause; a longer Retry-After ends the call.
	// The default is 30 s.
	MaxWait time.Duration

	init    sync.Once
	cfg     transportConfig
	err     error
	observe func(attempt) // for tests: sees every attempt
}

// transportConfig is a Transport's fields, defaults applied.
type transportConfig struct {
	base        http.RoundTripper
	header      string
	methods     []string
	maxAttempts int
	backoff     time.Duration
	maxWait     time.Duration
}

var _ http.RoundTripper = (*Transport)(nil)

// setup applies the defaults and checks the fields, once.
func (t *Transport) setup() (*transportConfig, error) {
	t.init.Do(func() {
		l := configerr.New(ErrInvalidConfig)
		configerr.NotNegative(l, "MaxAttempts", t.MaxAttempts)
		configerr.NotNegative(l, "Backoff", t.Backoff)
		configerr.NotNegative(l, "MaxWait", t.MaxWait)
		if t.Header != "" && !isToken(t.Header) {
			l.Addf("Header %q is not a header name", t.Header)
		}
		for _, m := range t.Methods {
			if !isToken(m) {
				l.Addf("method %q is not a method name", m)
			}
		}
		t.err = l.Err()
		t.cfg = transportConfig{
			base:        cmp.Or[http.RoundTripper](t.Base, http.DefaultTransport),
			header:      http.CanonicalHeaderKey(cmp.Or(t.Header, defaultHeader)),
			methods:     slices.Clone(t.Methods),
			maxAttempts: cmp.Or(t.MaxAttempts, 5),
			backoff:     cmp.Or(t.Backoff, 200*time.Millisecond),
			maxWait:     cmp.Or(t.MaxWait, 30*time.Second),
		}
		if len(t.cfg.methods) == 0 {
			t.cfg.methods = []string{http.MethodPost, http.MethodPatch}
		}
	})
	return &t.cfg, t.err
}

// verdict is what a Transport does after one attempt.
type verdict string

const (
	verdictDone      verdict = "done"      // a final answer, or an error no retry cures
	verdictRetry     verdict = "retry"     // another attempt follows after attempt.Wait
	verdictUnsafe    verdict = "unsafe"    // no key and not idempotent, or a body not rewound
	verdictExhausted verdict = "exhausted" // this was attempt MaxAttempts
	verdictTooLong   verdict = "too_long"  // the pause passes the deadline or MaxWait
)

// attempt is one attempt of a call, as the tests observe it.
type attempt struct {
	Request  *http.Request // the request sent, its key in the header
	Key      string        // empty when the request carried none
	Number   int           // from 1
	Status   int           // 0 without a response
	Replayed bool          // the response carries Idempotent-Replayed: true
	Err      error         // nil with a response
	Verdict  verdict
	Wait     time.Duration // the pause before the next attempt
}

// CallError is the error of a call that ended without a response. Key is
// the key its attempts carried, for a retry with [WithKey]. Under
// [http.Client].Timeout, net/http may return its own error instead.
type CallError struct {
	Key string // empty when the call carried no key
	Err error  // the last attempt's error, or the context's cause
}

func (e *CallError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("httpidem: call without an idempotency key: %v", e.Err)
	}
	return fmt.Sprintf("httpidem: call with idempotency key %q: %v", e.Key, e.Err)
}

func (e *CallError) Unwrap() error { return e.Err }

// Timeout reports whether Err is a timeout, for [url.Error].Timeout.
func (e *CallError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

type ctxKey struct{}

// WithKey returns ctx carrying key, for a caller that retries a call
// itself. A [Transport] sends it on a request of its Methods without a key
// header. An empty key leaves ctx as it is.
func WithKey(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, key)
}

// RoundTrip sends req, and again while a retry may cure its failure and is
// safe. The last response's Request carries the key. A call that ends
// without a response returns a [*CallError].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	cfg, err := t.setup()
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	out, key := cfg.withKey(req)
	hasBody := req.Body != nil && req.Body != http.NoBody
	// unsafe: a retry may not be sent (no key and not idempotent, or a body
	// that cannot be rewound).
	unsafe := key == "" && !idempotentMethod(req.Method) || hasBody && req.GetBody == nil
	for n := 1; ; n++ {
		var reached atomic.Bool
		trace := &httptrace.ClientTrace{GetConn: func(string) { reached.Store(true) }}
		sent := out.WithContext(httptrace.WithClientTrace(ctx, trace))
		resp, err := cfg.base.RoundTrip(sent)
		if resp == nil && err == nil { // a RoundTripper's contract forbids it
			err = errNoResponse
		}
		if resp != nil && resp.Request == nil {
			resp.Request = sent
		}
		if err != nil && resp != nil { // a RoundTripper's contract forbids both
			_ = resp.Body.Close()
			resp = nil
		}
		v, wait := cfg.decide(ctx, unsafe, n, resp, err, reached.Load())
		var next *http.Request
		if v == verdictRetry && hasBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				v = verdictUnsafe
			} else {
				next = out.Clone(ctx)
				next.Body = body
			}
		} else if v == verdictRetry {
			next = out
		}
		if t.observe != nil {
			a := attempt{Request: sent, Key: key, Number: n, Replayed: replayed(resp), Err: err, Verdict: v, Wait: wait}
			if resp != nil {
				a.Status = resp.StatusCode
			}
			t.observe(a)
		}
		if v != verdictRetry {
			if err != nil {
				return nil, &CallError{Key: key, Err: err}
			}
			return resp, nil
		}
		// Closed unread: draining may wait on a server that stalls its body.
		if resp != nil {
			_ = resp.Body.Close()
		}
		if err := sleep(ctx, wait); err != nil {
			if next.Body != nil && next != out {
				_ = next.Body.Close()
			}
			return nil, &CallError{Key: key, Err: err}
		}
		out = next
	}
}

// CloseIdleConnections closes the idle connections of Base, when it can.
func (t *Transport) CloseIdleConnections() {
	cfg, _ := t.setup()
	if c, ok := cfg.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// withKey returns the request to send and its key: req when it has a key
// or gets none, else a copy with the context's key or a fresh one.
func (cfg *transportConfig) withKey(req *http.Request) (*http.Request, string) {
	if key := headerValue(req.Header, cfg.header); key != "" {
		return req, key
	}
	if !slices.Contains(cfg.methods, cmp.Or(req.Method, http.MethodGet)) {
		return req, ""
	}
	key, ok := req.Context().Value(ctxKey{}).(string)
	if !ok {
		key = watermill.NewUUID()
	}
	out := req.Clone(req.Context())
	if out.Header == nil {
		out.Header = http.Header{}
	}
	out.Header.Set(cfg.header, key)
	return out, key
}

// errNoResponse: the base returned neither a response nor an error.
var errNoResponse = errors.New("httpidem: the base RoundTripper returned no response and no error")

// headerValue returns the first value of the header name in h, also under
// a spelling that is not canonical: a second key header would be invalid.
func headerValue(h http.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for k, vs := range h {
		if len(vs) > 0 && vs[0] != "" && strings.EqualFold(k, name) {
			return vs[0]
		}
	}
	return ""
}

// sleep waits d, or until ctx ends and returns its cause.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(ReplayedHeader) == "true"
}
