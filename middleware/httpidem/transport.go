package httpidem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// Defaults of TransportConfig.
const (
	// DefaultMaxAttempts bounds the attempts of one call: the first and
	// up to four retries.
	DefaultMaxAttempts = 5
	// DefaultBackoffBase is the pause before the first retry that has no
	// Retry-After to follow, before jitter; it doubles with each retry.
	DefaultBackoffBase = 200 * time.Millisecond
	// DefaultBackoffMax caps the exponential backoff.
	DefaultBackoffMax = 10 * time.Second
	// DefaultMaxRetryAfter is the longest Retry-After a Transport waits
	// for; a response asking for a longer pause is returned as it is.
	DefaultMaxRetryAfter = 30 * time.Second
)

// TransportConfig configures a Transport. The zero TransportConfig is
// valid: every field has a usable zero value, documented on the field.
type TransportConfig struct {
	// Base sends each attempt. Nil means http.DefaultTransport.
	Base http.RoundTripper

	// Header is the request header that carries the key. Empty means
	// DefaultHeader ("Idempotency-Key"); it must be the server's
	// Config.Header.
	Header string

	// Methods lists the request methods that get a key when they have
	// none. Methods are case-sensitive, as in HTTP. Nil or empty means
	// POST and PATCH, the server's default.
	Methods []string

	// NewKey returns a fresh key for one call. Nil means a random
	// version 4 UUID (watermill.NewUUID).
	NewKey func() string

	// MaxAttempts bounds the attempts of one call, the first included: 1
	// sends each request once. Zero means DefaultMaxAttempts (5).
	MaxAttempts int

	// BackoffBase is the pause before the first retry that follows no
	// Retry-After, before jitter. Zero means DefaultBackoffBase (200 ms).
	BackoffBase time.Duration

	// BackoffMax caps every backoff pause. Zero means DefaultBackoffMax
	// (10 s).
	BackoffMax time.Duration

	// MaxRetryAfter is the longest Retry-After the Transport waits for: a
	// response that asks for a longer pause is returned to the caller at
	// once, rather than retried before the server asked. Zero means
	// DefaultMaxRetryAfter (30 s).
	MaxRetryAfter time.Duration

	// OnAttempt, when set, is called after every attempt, with what the
	// Transport decided to do next (Attempt.Verdict): for logs, metrics or
	// traces. It runs on the goroutine of the call, concurrently for
	// concurrent calls, must be fast, and must not read or close a
	// response body. Nil means none.
	OnAttempt func(Attempt)
}

// Transport is an http.RoundTripper that sends idempotent calls and
// retries them safely. Each POST or PATCH (TransportConfig.Methods) that
// has no Idempotency-Key gets one, a fresh UUID or the key of its context
// (WithKey), and every retry of that call sends the same key, so a server
// running the Middleware runs the call's effect once and answers the
// retries with its stored response.
//
//	t, err := httpidem.NewTransport(httpidem.TransportConfig{}, logger)
//	client := &http.Client{Transport: t}
//
// Retried, with the same key: no response (a network error, or the
// connection broke after the request was sent); 409 with Retry-After; 429;
// every 5xx but 501 and 505. The pause is the Retry-After (seconds or an
// HTTP-date), else exponential backoff with jitter, BackoffBase·2^(n−1)
// capped at BackoffMax, each pause in the upper half of its step. At most
// MaxAttempts attempts, and never past the request's context.
//
// Never retried: 2xx, 3xx, and 4xx other than 409 with Retry-After and 429
// (400 and 422 are final); a replay (Idempotent-Replayed: true), whatever
// its status; a request with no key whose method is not idempotent; a request whose body has no GetBody (it is sent once); a
// Retry-After over MaxRetryAfter, or a pause that would end after the
// context's deadline (the response is returned at once). The package
// documentation, "The client side", has the details.
//
// A Transport is safe for concurrent use.
type Transport struct {
	cfg     TransportConfig
	methods map[string]bool
	logger  watermill.LoggerAdapter
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport for cfg, which is copied; a nil logger
// means watermill.NopLogger. Retries are logged at Debug. It reports every
// problem of cfg, joined with errors.Join, each matching ErrInvalidConfig,
// in this fixed order: MaxAttempts, BackoffBase, BackoffMax and
// MaxRetryAfter (none negative); Header (a header name); Methods (each a
// method name).
func NewTransport(cfg TransportConfig, logger watermill.LoggerAdapter) (*Transport, error) {
	l := configerr.New(ErrInvalidConfig)
	configerr.NotNegative(l, "MaxAttempts", cfg.MaxAttempts)
	configerr.NotNegative(l, "BackoffBase", cfg.BackoffBase)
	configerr.NotNegative(l, "BackoffMax", cfg.BackoffMax)
	configerr.NotNegative(l, "MaxRetryAfter", cfg.MaxRetryAfter)
	if cfg.Header != "" && !isToken(cfg.Header) {
		l.Addf("Header %q is not a header name", cfg.Header)
	}
	for _, m := range cfg.Methods {
		if !isToken(m) {
			l.Addf("method %q is not a method name", m)
		}
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	if cfg.Base == nil {
		cfg.Base = http.DefaultTransport
	}
	cfg.Header = http.CanonicalHeaderKey(cmp.Or(cfg.Header, DefaultHeader))
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.NewKey == nil {
		cfg.NewKey = watermill.NewUUID
	}
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.BackoffBase = cmp.Or(cfg.BackoffBase, DefaultBackoffBase)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, DefaultBackoffMax)
	cfg.MaxRetryAfter = cmp.Or(cfg.MaxRetryAfter, DefaultMaxRetryAfter)
	t := &Transport{cfg: cfg, methods: map[string]bool{}, logger: logger}
	for _, m := range cfg.Methods {
		t.methods[m] = true
	}
	t.cfg.Methods = slices.Clone(cfg.Methods)
	if t.logger == nil {
		t.logger = watermill.NopLogger{}
	}
	return t, nil
}

// Verdict is what a Transport does after one attempt; it is a label for
// logs and metrics.
type Verdict string

// The verdicts of Attempt.Verdict.
const (
	// VerdictDone: the answer is final and goes to the caller: a 2xx, 3xx
	// or final 4xx response, a replay, or an error that no retry can cure (the
	// request's context ended, a certificate was refused, the server does
	// not speak TLS, the request was refused before it reached the
	// network).
	VerdictDone Verdict = "done"
	// VerdictRetry: the attempt failed in a way a retry may cure; another
	// attempt follows after Attempt.Wait.
	VerdictRetry Verdict = "retry"
	// VerdictUnsafe: a retry may cure it, but the request may not be sent
	// again: it carries no key and its method is not idempotent, or its
	// body cannot be rewound. The answer goes to the caller.
	VerdictUnsafe Verdict = "unsafe"
	// VerdictExhausted: a retry may cure it, but this was attempt
	// MaxAttempts. The answer goes to the caller.
	VerdictExhausted Verdict = "exhausted"
	// VerdictTooLong: a retry may cure it, but the pause before it would
	// end after the request's context does, or Retry-After asks for more
	// than MaxRetryAfter. The answer goes to the caller at once.
	VerdictTooLong Verdict = "too_long"
)

// Attempt is one attempt of a call, as TransportConfig.OnAttempt sees it.
type Attempt struct {
	// Request is the request the attempt sent, its key in the header. Its
	// body may still be in use: do not read it.
	Request *http.Request
	// Key is the key the request carried, empty when it carried none.
	Key string
	// Number counts the attempts of the call, from 1.
	Number int
	// Status is the response's status code, 0 when the attempt got no
	// response (Err).
	Status int
	// Replayed reports that the response carries Idempotent-Replayed:
	// true: the server answered with the stored response of an earlier
	// attempt.
	Replayed bool
	// Err is the attempt's error, nil when it got a response.
	Err error
	// Verdict is what the Transport does next.
	Verdict Verdict
	// Wait is the pause before the next attempt, when Verdict is
	// VerdictRetry.
	Wait time.Duration
}

// CallError is the error RoundTrip returns when a call ends without a
// response. It names the key the call's attempts carried, so that the
// caller can retry the call itself with WithKey, and how many attempts
// were made; Err is the last attempt's error, or the request context's
// cause when it ended during a pause. Under http.Client.Timeout, net/http
// may return its own timeout error instead: choose the key first (WithKey)
// to be sure of it.
type CallError struct {
	Key      string
	Attempts int
	Err      error
}

func (e *CallError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("httpidem: %d attempt(s), no idempotency key: %v", e.Attempts, e.Err)
	}
	return fmt.Sprintf("httpidem: %d attempt(s) with idempotency key %q: %v", e.Attempts, e.Key, e.Err)
}

func (e *CallError) Unwrap() error { return e.Err }

// Timeout reports whether Err is a timeout (a context deadline, a network
// timeout), so that url.Error.Timeout and net.Error checks, which do not
// unwrap, see through a CallError.
func (e *CallError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

type ctxKey struct{}

// WithKey returns ctx carrying key, for a caller that retries a logical call
// itself: every request made with the returned context, whose method is one
// of TransportConfig.Methods and that has no key header of its own,
// carries key. An empty key leaves ctx as it is. A key chosen before the
// call is known whatever the call returns, also when http.Client.Timeout
// replaces the *CallError that would name it.
func WithKey(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, key)
}

// KeyFromContext returns the key that WithKey put in ctx.
func KeyFromContext(ctx context.Context) (string, bool) {
	key, ok := ctx.Value(ctxKey{}).(string)
	return key, ok
}

// RoundTrip sends req, and again while its attempts fail in a way that a
// retry may cure and that may safely be retried. The response it returns
// is the last attempt's; its Request is the request that attempt sent, with
// the key in the header. A call that ends without a response returns a
// *CallError.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	out, key := t.withKey(req)
	c := call{
		mayRetry: key != "" || idempotentMethod(req.Method),
		rewind:   req.GetBody,
		hasBody:  req.Body != nil && req.Body != http.NoBody,
	}
	for n := 1; ; n++ {
		var reached atomic.Bool
		trace := &httptrace.ClientTrace{GetConn: func(string) { reached.Store(true) }}
		sent := out.WithContext(httptrace.WithClientTrace(ctx, trace))
		resp, err := t.cfg.Base.RoundTrip(sent)
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
		verdict, wait := t.decide(ctx, &c, n, resp, err, reached.Load())
		var next *http.Request
		if verdict == VerdictRetry && c.hasBody {
			body, gerr := c.rewind()
			if gerr != nil {
				verdict = VerdictUnsafe
			} else {
				next = out.Clone(ctx)
				next.Body = body
			}
		} else if verdict == VerdictRetry {
			next = out
		}
		t.report(Attempt{Request: sent, Key: key, Number: n, Status: status(resp), Replayed: replayed(resp),
			Err: err, Verdict: verdict, Wait: wait})
		if verdict != VerdictRetry {
			if err != nil {
				return nil, &CallError{Key: key, Attempts: n, Err: err}
			}
			return resp, nil
		}
		// The retried response is closed unread: draining it would wait on
		// a server that may stall its body, and the connection is cheap to
		// replace.
		if resp != nil {
			_ = resp.Body.Close()
		}
		if err := sleep(ctx, wait); err != nil {
			if next.Body != nil && next != out {
				_ = next.Body.Close()
			}
			return nil, &CallError{Key: key, Attempts: n, Err: err}
		}
		out = next
	}
}

// CloseIdleConnections closes the idle connections of the base transport,
// when it has such a method (http.Transport does), so that
// http.Client.CloseIdleConnections reaches them through a Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.cfg.Base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// call is what RoundTrip knows of one call across its attempts.
type call struct {
	mayRetry bool // it carries a key, or its method is idempotent
	hasBody  bool
	rewind   func() (io.ReadCloser, error)
}

// withKey returns the request to send and the key it carries: req itself
// when it has a key of its own or gets none, else a copy with the key of
// its context or a fresh one.
func (t *Transport) withKey(req *http.Request) (*http.Request, string) {
	if key := headerValue(req.Header, t.cfg.Header); key != "" {
		return req, key
	}
	if !t.methods[cmp.Or(req.Method, http.MethodGet)] {
		return req, ""
	}
	key, ok := KeyFromContext(req.Context())
	if !ok {
		key = t.cfg.NewKey()
	}
	out := req.Clone(req.Context())
	if out.Header == nil {
		out.Header = http.Header{}
	}
	out.Header.Set(t.cfg.Header, key)
	return out, key
}

// errNoResponse stands for the error of a base RoundTripper that returned
// neither a response nor an error.
var errNoResponse = errors.New("httpidem: the base RoundTripper returned no response and no error")

// headerValue returns the first value of the header name in h, also when
// h holds it under a spelling that is not canonical (set directly in the
// map): HTTP header names are case-insensitive, and a second key header
// would make the request invalid.
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

func (t *Transport) report(a Attempt) {
	if a.Verdict == VerdictRetry {
		t.logger.Debug("httpidem: retrying", watermill.LogFields{"method": a.Request.Method, "url": a.Request.URL.Redacted(),
			"key": a.Key, "attempt": a.Number, "status": a.Status, "err": a.Err, "wait": a.Wait})
	}
	if t.cfg.OnAttempt != nil {
		t.cfg.OnAttempt(a)
	}
}

// sleep waits d, or until ctx ends, and then returns its cause.
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

func status(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

func replayed(resp *http.Response) bool {
	return resp != nil && resp.Header.Get(ReplayedHeader) == "true"
}
