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
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// flushAfter is how long recording COMPLETED may take before the response
// is flushed to the client. A store that answers in time changes nothing on
// the wire (net/http still frames a small response with Content-Length);
// a slow or failing one no longer holds the body back while Lease.Complete
// retries, only the end of the response.
const flushAfter = 100 * time.Millisecond

// Middleware runs POST and PATCH handlers once per Idempotency-Key. Build
// it with [New]; it is safe for concurrent use.
type Middleware struct {
	cfg      Config
	once     *idempotency.Once
	logger   watermill.LoggerAdapter
	maxBody  int  // the Once's MaxOutputSize: the largest response stored
	failOpen bool // the Once's FailOpen
	scope    func(*http.Request) string
}

// New returns the middleware for cfg on once, whose store, lease, TTLs,
// FailOpen, Observer, logger and MaxOutputSize it uses; share one Once
// with the other adapters of the process. A nil cfg has neither Scope nor
// SingleTenant, so it is refused. New reports every problem at once, each
// matching [ErrInvalidConfig].
func New(once *idempotency.Once, cfg *Config) (*Middleware, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c, err := cfg.withDefaults()
	if once == nil {
		err = errors.Join(fmt.Errorf("%w: the Once is nil", ErrInvalidConfig), err)
	}
	if err != nil {
		return nil, err
	}
	if err := adapter.UsePrefix(once, c.KeyPrefix, true); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	oc := once.Config()
	m := &Middleware{cfg: c, once: once, logger: oc.Logger, maxBody: oc.MaxOutputSize, failOpen: oc.FailOpen, scope: c.Scope}
	if c.SingleTenant {
		m.scope = func(*http.Request) string { return "" }
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
	label string // the Observer's label: the route pattern, or "http"
	// The request's context, the stored key and the attempt count read by
	// the claim, for the Observer.
	ctx      context.Context
	key      string
	attempts int
	// parsedKey is the key as parsed from the header, for RequestKey.
	parsedKey string
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	rq := request{label: r.Pattern, ctx: r.Context()}
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
	key, err := parseKey(values[0])
	if err != nil {
		m.done(rq, idempotency.OutcomeMissingKey, nil)
		m.writeProblem(w, idempotency.OutcomeMissingKey, describeKeyError(m.cfg.Header, err), nil)
		return
	}

	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	fp := fingerprint(r, body)
	skey := adapter.StoreKey(m.cfg.KeyPrefix, m.scope(r), key, true)
	rq.key = skey
	rq.parsedKey = key
	lease, claim, err := m.once.Claim(adapter.WithLabel(r.Context(), rq.label), skey, fp)
	rq.attempts = claim.Record.Attempts
	switch {
	case err == nil && lease != nil:
		m.run(w, r, next, lease, rq)
	case err == nil:
		m.answerRepeat(w, claim.Record, fp, rq)
	case errors.Is(err, idempotency.ErrTooManyAttempts):
		m.done(rq, idempotency.OutcomeTooManyAttempts, err)
		m.writeProblem(w, idempotency.OutcomeTooManyAttempts,
			"The request with this key failed too many times, and will not run again with it. Use a new key.", nil)
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
	case idempotency.OutcomeOf(err) == idempotency.OutcomeCallerGone:
		// The client hung up during the claim: no sign of the store.
		m.done(rq, idempotency.OutcomeCallerGone, err)
	case m.failOpen && r.Context().Err() == nil:
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
		m.writeProblem(w, idempotency.Outcome(adapter.BodyTooLarge),
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
			m.writeProblem(w, idempotency.Outcome(adapter.BodyUnreadable), "The request body could not be read in full.", nil)
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
	rec := newRecorder(w, m.maxBody)
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
		m.logger.Info("Response too large to store; repeats will be answered 410", watermill.LogFields{"idempotency_key": rq.key,
			"status": resp.Status, "body_size": resp.BodySize, "max_output_size": m.maxBody})
	}
	cerr := m.complete(rec, lease, resp.encode())
	m.done(rq, idempotency.OutcomeOf(cerr), cerr)
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

// done counts and logs one outcome, through the Once.
func (m *Middleware) done(rq request, outcome idempotency.Outcome, err error) {
	m.once.Report(rq.ctx, idempotency.OutcomeDetails{Handler: rq.label, Key: rq.key, Outcome: outcome, Attempt: rq.attempts, Err: err})
}
