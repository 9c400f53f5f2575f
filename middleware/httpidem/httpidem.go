package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/callergone"
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// flushAfter is how long recording COMPLETED may take before the response
// is flushed to the client. A store that answers in time changes nothing on
// the wire (net/http still frames a small response with Content-Length);
// a slow or failing one no longer holds the body back while Lease.Complete
// retries, only the end of the response.
const flushAfter = 100 * time.Millisecond

// Middleware makes POST and PATCH handlers idempotent per Idempotency-Key.
// It is safe for concurrent use; build it with New.
type Middleware struct {
	cfg      Config
	once     *idempotency.Once
	logger   watermill.LoggerAdapter
	observer idempotency.Observer
	scope    func(*http.Request) string
}

// New returns a middleware for cfg, which is copied: later changes to the
// caller's Config have no effect. A nil logger logs nothing. An invalid
// Config is refused with every problem that Config.Validate reports, each
// matching ErrInvalidConfig (and ErrNilStore for a missing Store).
func New(cfg Config, logger watermill.LoggerAdapter) (*Middleware, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Middleware{cfg: cfg, scope: cfg.Scope, observer: cfg.common().ObserverOrNop()}
	if cfg.SingleTenant {
		m.scope = func(*http.Request) string { return "" }
	}
	// The one owner protocol claims, renews, completes and fails the keys;
	// the middleware only decides what each outcome means for HTTP.
	var err error
	if m.once, m.logger, err = cfg.common().NewOnce(logger); err != nil {
		return nil, err
	}
	return m, nil
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

// request is what the logs and the Observer say about one request.
type request struct {
	label  string // the Observer's label: the route pattern, or "http"
	fields watermill.LogFields
	// For a idempotency.ContextObserver: the request's context, the stored
	// key and the attempt count read by the claim.
	ctx      context.Context
	key      string
	attempts int
	// parsedKey is the key as parsed from the header, for RequestKey.
	parsedKey string
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rq := request{label: r.Pattern, fields: watermill.LogFields{"method": r.Method, "path": r.URL.Path}, ctx: r.Context()}
	if rq.label == "" {
		rq.label = defaultOutcomeLabel
	}
	values := r.Header.Values(m.cfg.Header)
	switch {
	case len(values) == 0 && m.cfg.KeyOptional:
		next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		m.done(rq, idempotency.OutcomeMissingKey, nil)
		m.writeProblem(w, idempotency.OutcomeMissingKey,
			fmt.Sprintf("%s %s requires an %s header: send a unique key (a V4 UUID, say) and reuse it when you retry.",
				r.Method, r.URL.Path, m.cfg.Header), nil)
		return
	case len(values) > 1:
		m.done(rq, idempotency.OutcomeMissingKey, nil)
		m.writeProblem(w, idempotency.OutcomeMissingKey,
			fmt.Sprintf("The %s header must appear once; it appears %d times.", m.cfg.Header, len(values)), nil)
		return
	}
	key, err := parseKey(values[0], adapter.DefaultMaxKeyLength)
	if err != nil {
		m.done(rq, idempotency.OutcomeMissingKey, nil)
		m.writeProblem(w, idempotency.OutcomeMissingKey, describeKeyError(m.cfg.Header, adapter.DefaultMaxKeyLength, err), nil)
		return
	}

	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	fp := fingerprint(r, body)
	skey := adapter.StoreKey(m.cfg.KeyPrefix, m.scope(r), key)
	// The stored key names the record for an operator; it holds the
	// scope's hash, never the scope.
	rq.fields["idempotency_key"] = key
	rq.fields["stored_key"] = skey

	rq.key = skey
	rq.parsedKey = key
	lease, claim, err := m.once.Claim(r.Context(), skey, idempotency.ClaimOptions{Fingerprint: fp, LogFields: rq.fields})
	rq.attempts = claim.Record.Attempts
	switch {
	case err == nil && lease != nil:
		m.run(w, r, next, lease, rq)
	case err == nil:
		m.answerRepeat(w, claim.Record, fp, rq)
	case errors.Is(err, idempotency.ErrCorruptRecord):
		m.done(rq, idempotency.OutcomeCorruptRecord, err)
		m.writeProblem(w, idempotency.OutcomeCorruptRecord,
			"The idempotency record of this key cannot be read, so the request was not run. Retrying with the same key will not help until the server's operator repairs it.", nil)
	default:
		m.claimFailed(w, r, next, err, rq)
	}
}

// claimFailed answers a request whose claim failed (ErrStoreUnavailable).
// A client that is gone gets the 503 as well (net/http would otherwise send
// an empty 200 to whoever still reads), and nothing runs for it, even with
// FailOpen.
func (m *Middleware) claimFailed(w http.ResponseWriter, r *http.Request, next http.Handler, err error, rq request) {
	switch {
	case errors.Is(err, callergone.Err):
		// The client hung up during the claim: no sign of the store.
		m.done(rq, idempotency.OutcomeCallerGone, err)
	case m.cfg.FailOpen && r.Context().Err() == nil:
		m.done(rq, idempotency.OutcomeFailOpen, err)
		next.ServeHTTP(w, r.WithContext(withRequestKey(r.Context(), m.cfg.KeyPrefix, rq.parsedKey, rq.key)))
		return
	default:
		m.done(rq, idempotency.OutcomeStoreUnavailable, err)
	}
	m.writeProblem(w, idempotency.OutcomeStoreUnavailable,
		"The idempotency store cannot be reached, so the request was not run. Retry later with the same key.", nil)
}

// readBody reads the request body in full (bounded) and puts it back for the
// handler. It answers the request itself and returns false when it cannot.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		m.writeProblem(w, adapter.BodyTooLarge,
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
			m.writeProblem(w, adapter.BodyUnreadable, "The request body could not be read in full.", nil)
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
func (m *Middleware) answerRepeat(w http.ResponseWriter, rec idempotency.Record, fp []byte, rq request) {
	if len(rec.Fingerprint) > 0 && !bytes.Equal(rec.Fingerprint, fp) {
		m.done(rq, idempotency.OutcomeKeyReused, nil)
		m.writeProblem(w, idempotency.OutcomeKeyReused,
			fmt.Sprintf("This %s was first used for a different request (method, path, query or body). Use a new key for a new request.", m.cfg.Header), nil)
		return
	}
	switch rec.State {
	case idempotency.StateCompleted:
		m.replay(w, rec.Result, rq)
	default:
		// IN_PROGRESS held by another request. (A FAILED record is claimed
		// unless its fingerprint differs, handled above; a store answering
		// otherwise is treated the same way: retry later.)
		m.done(rq, idempotency.OutcomeInProgress, nil)
		m.writeProblem(w, idempotency.OutcomeInProgress,
			fmt.Sprintf("A request with this %s is still being processed. Retry later with the same key.", m.cfg.Header), nil)
	}
}

// replay answers with a stored response: the same status, handler headers and
// body, plus Idempotent-Replayed: true.
func (m *Middleware) replay(w http.ResponseWriter, result []byte, rq request) {
	s, err := decodeResponse(result)
	if err != nil {
		m.done(rq, idempotency.OutcomeCorruptRecord, fmt.Errorf("stored response of a completed key: %w", err))
		m.writeProblem(w, idempotency.OutcomeCorruptRecord,
			"The request with this key completed, but its stored response cannot be read.", nil)
		return
	}
	m.done(rq, idempotency.OutcomeDuplicate, nil)
	if s.BodyOmitted {
		m.writeProblem(w, idempotency.OutcomeOutputNotStored,
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

// run executes the handler as the key's owner, under the lease's context,
// then records the outcome: FAILED after a 5xx, a panic or a lost lease,
// COMPLETED with the response otherwise, also when the client left before
// the handler returned (its retry gets the replay).
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, lease *idempotency.Lease, rq request) {
	// A copy: the lease reads the fields it was given from its renewal timer.
	rq.fields = rq.fields.Copy().Add(watermill.LogFields{"attempts": lease.Record().Attempts})
	rec := newRecorder(w, m.cfg.MaxResponseBody)
	ctx := lease.Context()

	adapter.RunHandler(lease, func(err error) { m.done(rq, idempotency.OutcomeHandlerFailed, err) },
		func() { next.ServeHTTP(rec, r.WithContext(withRequestKey(ctx, m.cfg.KeyPrefix, rq.parsedKey, rq.key))) })

	resp := rec.response()
	if cause := context.Cause(ctx); errors.Is(cause, idempotency.ErrLeaseLost) {
		// Another request may have claimed the key and be running it: this
		// run's answer is not the key's outcome.
		lease.Fail()
		m.done(rq, idempotency.OutcomeHandlerFailed, fmt.Errorf("handler answered %d after its lease was lost: %w", resp.Status, cause))
		return
	}
	if resp.Status >= 500 {
		lease.Fail()
		m.done(rq, idempotency.OutcomeHandlerFailed, fmt.Errorf("handler answered %d", resp.Status))
		return
	}
	if resp.BodyOmitted {
		m.logger.Info("Response too large to store; repeats will be answered 410", rq.fields.Copy().Add(watermill.LogFields{
			"status": resp.Status, "body_size": resp.BodySize, "max_response_body": m.cfg.MaxResponseBody,
		}))
	}
	cerr := m.complete(rec, lease, resp.encode())
	m.done(rq, idempotency.CompleteOutcome(cerr), cerr)
}

// complete records COMPLETED with result. Lease.Complete retries until the
// lease runs out while the store fails; should it take longer than
// flushAfter, the response is flushed meanwhile, so that the client has the
// whole body and only the end of the response waits.
func (m *Middleware) complete(rec *recorder, lease *idempotency.Lease, result []byte) error {
	var mu sync.Mutex // held by a flush that runs; taken once Complete returns
	flushed := false
	t := time.AfterFunc(flushAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if !flushed {
			flushed = true
			rec.Flush()
		}
	})
	err := lease.Complete(result)
	t.Stop()
	// The response must not be touched once the handler chain returns: wait
	// for a flush that already started, and keep a later one from starting.
	mu.Lock()
	flushed = true
	mu.Unlock()
	return err
}

// report tells the Observer about one outcome.
func (m *Middleware) report(rq request, outcome idempotency.Outcome, err error) {
	idempotency.ReportOutcome(rq.ctx, m.observer, idempotency.OutcomeDetails{Handler: rq.label, Scope: rq.label,
		Key: rq.key, Outcome: outcome, Attempt: rq.attempts, Replayed: outcome == idempotency.OutcomeDuplicate, Err: err})
}

// done counts one outcome and logs it at the level adapter.LogOutcome
// gives it.
func (m *Middleware) done(rq request, outcome idempotency.Outcome, err error) {
	m.report(rq, outcome, err)
	adapter.LogOutcome(m.logger, rq.fields, outcome, err)
}
