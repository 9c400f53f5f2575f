package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware"
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// Middleware makes POST and PATCH handlers idempotent per Idempotency-Key.
// It is safe for concurrent use; build it with New.
type Middleware struct {
	cfg    Config
	logger watermill.LoggerAdapter
}

// New returns a middleware for cfg, which is copied: later changes to the
// caller's Config have no effect. A nil logger logs nothing.
func New(cfg Config, logger watermill.LoggerAdapter) (*Middleware, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Middleware{cfg: cfg, logger: logger}, nil
}

// Handler wraps next, as a func(http.Handler) http.Handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.cfg.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(m.cfg.Header)
	switch {
	case len(values) == 0 && m.cfg.KeyOptional:
		next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		m.writeProblem(w, http.StatusBadRequest, ProblemKeyMissing,
			fmt.Sprintf("%s %s requires an %s header: send a unique key (a V4 UUID, say) and reuse it when you retry.",
				r.Method, r.URL.Path, m.cfg.Header), nil)
		return
	case len(values) > 1:
		m.writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid,
			fmt.Sprintf("The %s header must appear once; it appears %d times.", m.cfg.Header, len(values)), nil)
		return
	}
	key, err := parseKey(values[0], m.cfg.MaxKeyLength)
	if err != nil {
		m.writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, describeKeyError(m.cfg.Header, m.cfg.MaxKeyLength, err), nil)
		return
	}

	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	fp := fingerprint(r, body)
	skey := storeKey(m.cfg.KeyPrefix, m.cfg.Scope(r), key)
	fields := watermill.LogFields{"idempotency_key": key, "method": r.Method, "path": r.URL.Path}

	claimedAt := time.Now() // before the call: the store counts the lease from no earlier
	claimCtx, cancelClaim := context.WithTimeout(r.Context(), m.cfg.StoreTimeout)
	claim, err := m.cfg.Store.Claim(claimCtx, skey, m.cfg.Lease, fp)
	cancelClaim()
	if err != nil {
		m.claimFailed(w, r, next, err, fields)
		return
	}
	if claim.Acquired {
		m.run(w, r, next, claimedAt, skey, claim.Token, fields)
		return
	}
	m.answerRepeat(w, r, claim.Record, fp, fields)
}

// claimFailed answers a request whose claim failed. A client that is gone
// gets the 503 as well (net/http would otherwise send an empty 200 to
// whoever still reads), and nothing runs for it, even with FailOpen.
func (m *Middleware) claimFailed(w http.ResponseWriter, r *http.Request, next http.Handler, err error, fields watermill.LogFields) {
	switch {
	case r.Context().Err() != nil:
		m.logger.Info("Claim interrupted: the client is gone", fields.Copy().Add(watermill.LogFields{"err": err.Error()}))
	case m.cfg.FailOpen:
		m.logger.Error("Idempotency store unavailable, running the handler without idempotency (FailOpen)", err, fields)
		next.ServeHTTP(w, r)
		return
	default:
		m.logger.Error("Idempotency store unavailable, answering 503", err, fields)
	}
	m.writeProblem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable,
		"The idempotency store cannot be reached, so the request was not run. Retry later with the same key.", nil)
}

// readBody reads the request body in full (bounded) and puts it back for the
// handler. It answers the request itself and returns false when it cannot.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		m.writeProblem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge,
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxRequestBody), nil)
		return nil, false
	}
	if r.ContentLength > m.cfg.MaxRequestBody {
		return tooLarge()
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxRequestBody+1))
		_ = r.Body.Close()
		if err != nil {
			m.writeProblem(w, http.StatusBadRequest, ProblemBodyUnreadable, "The request body could not be read in full.", nil)
			return nil, false
		}
		if int64(len(body)) > m.cfg.MaxRequestBody {
			return tooLarge()
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	return body, true
}

// answerRepeat answers a request whose claim was refused, from the record
// that refused it.
func (m *Middleware) answerRepeat(w http.ResponseWriter, r *http.Request, rec middleware.Record, fp []byte, fields watermill.LogFields) {
	if len(rec.Fingerprint) > 0 && !bytes.Equal(rec.Fingerprint, fp) {
		m.writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused,
			fmt.Sprintf("This %s was first used for a different request (method, path, query or body). Use a new key for a new request.", m.cfg.Header), nil)
		return
	}
	switch rec.State {
	case middleware.StateCompleted:
		m.replay(w, rec.Result, fields)
	default:
		// IN_PROGRESS held by another request. (A FAILED record is claimed
		// unless its fingerprint differs, handled above; a store answering
		// otherwise is treated the same way: retry later.)
		m.writeProblem(w, http.StatusConflict, ProblemInProgress,
			fmt.Sprintf("A request with this %s is still being processed. Retry later with the same key.", m.cfg.Header), nil)
	}
}

// replay answers with a stored response: the same status, handler headers and
// body, plus Idempotent-Replayed: true.
func (m *Middleware) replay(w http.ResponseWriter, result []byte, fields watermill.LogFields) {
	s, err := decodeResponse(result)
	if err != nil {
		m.logger.Error("Cannot decode stored response", err, fields)
		m.writeProblem(w, http.StatusInternalServerError, ProblemStoredResponseCorrupt,
			"The request with this key completed, but its stored response cannot be read.", nil)
		return
	}
	if s.BodyOmitted {
		m.writeProblem(w, http.StatusGone, ProblemResponseNotStored,
			fmt.Sprintf("The request with this key completed with status %d, but its response (%d bytes) was too large to store and cannot be replayed. Do not retry with a new key: look the result up instead.",
				s.Status, s.BodySize),
			func(p *problem) { p.OriginalStatus = s.Status })
		return
	}
	h := w.Header()
	for name, values := range s.Header {
		if len(values) == 0 {
			h[name] = nil
			continue
		}
		h[name] = values
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(s.Status)
	_, _ = w.Write(s.Body)
}

// run executes the handler as the key's owner: it renews the lease while the
// handler runs, then records the outcome.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, claimedAt time.Time, key, token string, fields watermill.LogFields) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	lease := startLease(r.Context(), m.cfg.Store, key, token, m.cfg.Lease, m.cfg.StoreTimeout, claimedAt, cancel, m.logger.With(fields))
	rec := newRecorder(w, m.cfg.MaxResponseBody)
	fail := func(ctx context.Context) error { return m.cfg.Store.Fail(ctx, key, token, m.cfg.FailedTTL) }

	panicked := true
	defer func() {
		if panicked {
			// Record the failure, then let the panic go on to the outer
			// recovery (or net/http), as if this middleware were absent.
			lease.stop()
			m.finish(r, w, lease, fields, "fail after panic", false, fail)
		}
	}()
	next.ServeHTTP(rec, r.WithContext(ctx))
	panicked = false
	// A handler that returns without answering once its context ended (the
	// client left, or the lease was lost) was interrupted: it produced no
	// outcome to replay, so the key is FAILED and a retry runs it again.
	interrupted := !rec.wrote() && ctx.Err() != nil
	lease.stop()

	if interrupted {
		m.logger.Info("Handler interrupted before answering; the key is FAILED",
			fields.Copy().Add(watermill.LogFields{"cause": context.Cause(ctx).Error()}))
		m.finish(r, w, lease, fields, "fail", false, fail)
		return
	}
	resp := rec.response()
	if resp.Status >= 500 {
		m.finish(r, w, lease, fields, "fail", false, fail)
		return
	}
	if resp.BodyOmitted {
		m.logger.Info("Response too large to store; repeats will be answered 410", fields.Copy().Add(watermill.LogFields{
			"status": resp.Status, "body_size": resp.BodySize, "max_response_body": m.cfg.MaxResponseBody,
		}))
	}
	result := resp.encode()
	m.finish(r, w, lease, fields, "complete", true, func(ctx context.Context) error {
		return m.cfg.Store.Complete(ctx, key, token, result, m.cfg.CompletedTTL)
	})
}

// finish records the outcome with op, each call bounded by StoreTimeout and
// run whether or not the client is still there. When retry is set, a failed
// call is retried with backoff while the lease lasts: the response already
// went to the client, and a key left IN_PROGRESS expires and would let a
// retry run the effect again. ErrLeaseLost is final: another request owns
// the key.
func (m *Middleware) finish(r *http.Request, w http.ResponseWriter, lease *leaseKeeper, fields watermill.LogFields,
	name string, retry bool, op func(context.Context) error) {
	parent := context.WithoutCancel(r.Context())
	deadline := lease.expiry()
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(parent, m.cfg.StoreTimeout)
		err := op(ctx)
		cancel()
		if err == nil {
			if attempt > 1 {
				m.logger.Info("Idempotency record written after retries", fields.Copy().Add(watermill.LogFields{"op": name, "attempts": attempt}))
			}
			return
		}
		if errors.Is(err, middleware.ErrLeaseLost) {
			m.logger.Error("Lease lost before "+name+": another request may have run this key", err, fields)
			return
		}
		wait := time.Until(deadline)
		if !retry || wait <= 0 {
			m.logger.Error("Cannot write idempotency record ("+name+"); the key is freed when its lease expires",
				err, fields.Copy().Add(watermill.LogFields{"attempts": attempt}))
			return
		}
		if attempt == 1 {
			// Let the client have the whole body now; only the end of the
			// response waits for the retries.
			_ = http.NewResponseController(w).Flush()
		}
		m.logger.Debug("Retrying "+name, fields.Copy().Add(watermill.LogFields{"attempt": attempt, "err": err.Error()}))
		// The last attempt starts just before the lease runs out: the
		// store still decides by the owner token whether it may complete.
		time.Sleep(min(backoff, wait))
		backoff = min(2*backoff, time.Second)
	}
}
