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

// decide returns what to do after attempt n, which got resp or err, and
// the pause before a retry. reached says that the attempt asked the base
// for a connection.
func (cfg *transportConfig) decide(ctx context.Context, unsafe bool, n int, resp *http.Response, err error, reached bool) (verdict, time.Duration) {
	var wait time.Duration
	tooLong := false
	if err != nil {
		if !retryableError(ctx, err, reached) {
			return verdictDone, 0
		}
		wait = cfg.pause(n)
	} else {
		// A replay is final: every retry would get it again.
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
	case unsafe:
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

// retryableStatus reports whether resp asks for a retry: 409 with a
// Retry-After, 429, and every 5xx but 501 and 505.
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

// idempotentMethod reports whether RFC 9110 defines method as idempotent.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// pause returns the pause before retry n (n ≥ 1) without a Retry-After:
// Backoff·2^(n−1) capped at MaxWait, at a random point in its upper half.
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

// maxDeltaSeconds is the longest Retry-After a Duration holds.
const maxDeltaSeconds = int64(time.Duration(1<<63-1) / time.Second)

// retryAfter reads the Retry-After of h: seconds or an HTTP-date, never
// below zero. ok is false without one, or when it is neither; tooLong is
// true for seconds beyond a Duration.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok, tooLong bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false, false
	}
	// ParseUint takes digits only: no sign, no underscore in base 10.
	secs, err := strconv.ParseUint(v, 10, 64)
	if err == nil && secs <= uint64(maxDeltaSeconds) {
		return time.Duration(secs) * time.Second, true, false
	}
	if err == nil || errors.Is(err, strconv.ErrRange) {
		return 0, false, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false, false
	}
	return max(at.Sub(now), 0), true, false
}

// retryableError reports whether an attempt that failed with err may
// succeed if sent again: its context lives, it failed on the network, and
// not on a refused certificate or a server without TLS. Asking for a
// connection counts: an answer cut in its headers, or a lost HTTP/2
// connection, is a plain error (TestTransportLostResponse), while a request
// refused before any connection fails with one no retry cures.
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
