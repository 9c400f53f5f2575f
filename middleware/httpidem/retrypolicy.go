package httpidem

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// decide returns what to do after attempt n of c, which got resp or err;
// reached reports that the attempt asked the base transport for a
// connection (it passed the request's own checks). The wait is the pause
// before the next attempt, when the verdict is verdictRetry.
func (cfg *transportConfig) decide(ctx context.Context, c *call, n int, resp *http.Response, err error, reached bool) (verdict, time.Duration) {
	var wait time.Duration
	tooLong := false
	if err != nil {
		if !retryableError(ctx, err, reached) {
			return verdictDone, 0
		}
		wait = cfg.pause(n)
	} else {
		// A replay is the answer stored for the key: every retry would get
		// it again, so it is final whatever its status (a handler's own 409
		// or 429 is stored; 5xx never are).
		if !retryableStatus(resp) || replayed(resp) {
			return verdictDone, 0
		}
		ra, hasRA, huge := retryAfter(resp.Header, time.Now())
		switch {
		case huge || hasRA && ra > cfg.maxWait:
			tooLong = true
		case hasRA:
			wait = ra
		default:
			wait = cfg.pause(n)
		}
	}
	switch {
	case !c.mayRetry, c.hasBody && c.rewind == nil:
		return verdictUnsafe, 0
	case n >= cfg.maxAttempts:
		return verdictExhausted, 0
	case tooLong:
		return verdictTooLong, 0
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Add(wait).Before(deadline) {
		return verdictTooLong, 0
	}
	return verdictRetry, wait
}

// retryableStatus reports whether a response with resp's status asks for
// a retry: 409 with a Retry-After (the first request with the key still
// runs), 429, and every 5xx but 501 and 505, which say that the server
// will never serve the request.
func retryableStatus(resp *http.Response) bool {
	switch s := resp.StatusCode; {
	case s == http.StatusConflict:
		return len(resp.Header.Values("Retry-After")) > 0
	case s == http.StatusTooManyRequests:
		return true
	case s == http.StatusNotImplemented, s == http.StatusHTTPVersionNotSupported:
		return false
	default:
		return s >= 500 && s <= 599
	}
}

// idempotentMethod reports whether RFC 9110 (section 9.2.2) defines method
// as idempotent: a request with it may be repeated without a key.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// pause returns the pause before retry n (n ≥ 1) when no Retry-After
// says otherwise: exponential, Backoff·2^(n−1) capped at MaxWait,
// with "equal jitter": a random point in its upper half, so that clients
// that failed together do not retry together, and no pause is shorter than
// half its step.
func (cfg *transportConfig) pause(n int) time.Duration {
	step := cfg.maxWait
	if n-1 < 62 {
		if s := cfg.backoff << (n - 1); s > 0 && s>>(n-1) == cfg.backoff && s < step {
			step = s
		}
	}
	half := step / 2
	return step - half + rand.N(half+1)
}

// maxDeltaSeconds bounds a Retry-After in seconds that is still read as a
// number of seconds: beyond it (some 292 years) a Duration overflows, and
// the pause is too long anyway.
const maxDeltaSeconds = int64(time.Duration(1<<63-1) / time.Second)

// retryAfter reads the Retry-After header of h (RFC 9110, section 10.2.3):
// delay-seconds (digits only) or an HTTP-date, of which the pause is the
// time from now, never below zero. ok is false when there is no header or
// its first value is neither; tooLong is true for a number of seconds too
// large for a Duration.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok, tooLong bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false, false
	}
	if allDigits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > maxDeltaSeconds {
			return 0, false, true
		}
		return time.Duration(secs) * time.Second, true, false
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false, false
	}
	return max(at.Sub(now), 0), true, false
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// retryableError reports whether an attempt that failed with err may
// succeed if sent again: its context has not ended, it failed on the
// network (after asking the base transport for a connection, or with a
// network error of any base transport), and not because a certificate was
// refused or the server does not speak TLS, which a retry does not cure. The request may have reached the
// server (its response was lost): a retry is then safe only with the key,
// which is for decide to say.
//
// Why the connection request counts, not only the error's type: an answer
// cut in its headers surfaces from net/http as "HTTP/1.x transport
// connection broken: malformed MIME header", neither a net.Error nor EOF
// (TestTransportLostResponse fails without it), and HTTP/2's lost
// connections are plain errors too; while the errors of a request refused
// before any connection (an unsupported scheme, an invalid header value)
// are plain errors that no retry cures.
func retryableError(ctx context.Context, err error, reached bool) bool {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		herr  x509.HostnameError
		cerr  x509.CertificateInvalidError
		rerr  tls.RecordHeaderError // TLS to a server that answered in plain text
	)
	if errors.As(err, &verr) || errors.As(err, &uaerr) || errors.As(err, &herr) || errors.As(err, &cerr) || errors.As(err, &rerr) {
		return false
	}
	if reached {
		return true
	}
	var nerr net.Error
	var errno syscall.Errno
	return errors.As(err, &nerr) || errors.As(err, &errno) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
