package httpidem

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter/serve"
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// flushAfter is how long recording COMPLETED may take before the response
// is flushed: a slow store then holds back only the end of the response.
const flushAfter = 100 * time.Millisecond

// Middleware runs POST and PATCH handlers once per Idempotency-Key. Build
// it with [New]; it is safe for concurrent use.
type Middleware struct {
	cfg      Config
	once     *idempotency.Once
	logger   watermill.LoggerAdapter
	maxBody  int // the Once's MaxOutputSize
	failOpen bool
	scope    func(*http.Request) string
}

// New returns the middleware for cfg on once, which holds the store and
// the settings shared with the process's other adapters. A nil cfg is
// refused: it has neither Scope nor SingleTenant. New reports every
// problem at once, each matching [ErrInvalidConfig].
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
	oc := once.Config()
	m := &Middleware{cfg: c, once: once, logger: oc.Logger, maxBody: oc.MaxOutputSize, failOpen: oc.FailOpen, scope: c.Scope}
	if c.SingleTenant {
		m.scope = func(*http.Request) string { return "" }
	}
	return m, nil
}

// Handler wraps next, as a func(http.Handler) http.Handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

// details are the problem details of the refusals after a claim.
var details = map[idempotency.Outcome]string{
	idempotency.OutcomeTooManyAttempts:  "The request with this key failed too many times, and will not run again with it. Use a new key.",
	idempotency.OutcomeCorruptRecord:    "The idempotency record of this key cannot be read, so the request was not run. Retrying with the same key will not help until the server's operator repairs it.",
	idempotency.OutcomeStoreUnavailable: "The idempotency store cannot be reached, so the request was not run. Retry later with the same key.",
	idempotency.OutcomeKeyReused:        "This {header} was first used for a different request (method, path, query or body). Use a new key for a new request.",
	idempotency.OutcomeInProgress:       "A request with this {header} is still being processed. Retry later with the same key.",
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.cfg.Methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	rq := &serve.Request{Once: m.once, FailOpen: m.failOpen, Ctx: r.Context(), Label: cmp.Or(r.Pattern, defaultOutcomeLabel)}
	values := r.Header.Values(m.cfg.Header)
	if len(values) == 0 && m.cfg.KeyOptional {
		next.ServeHTTP(w, r)
		return
	}
	key, detail := m.key(r, values)
	if detail != "" {
		rq.Done(idempotency.OutcomeMissingKey, nil)
		m.writeProblem(w, idempotency.OutcomeMissingKey, detail, 0)
		return
	}

	body, ok := m.readBody(w, r)
	if !ok {
		return
	}
	fp := fingerprint(r, body)
	rq.Key = adapter.StoreKey(m.cfg.KeyPrefix, m.scope(r), key, true)
	lease, rec, outcome := rq.Claim(fp)
	switch outcome {
	case "":
		m.run(w, r, next, lease, rq)
	case idempotency.OutcomeDuplicate:
		m.replay(w, rec.Result, rq)
	case idempotency.OutcomeFailOpen:
		next.ServeHTTP(w, r.WithContext(serve.WithForwardKey(r.Context(), m.cfg.KeyPrefix, rq.Key)))
	default:
		m.writeProblem(w, outcome, strings.ReplaceAll(details[outcome], "{header}", m.cfg.Header), 0)
	}
}

// key returns the key of the header's values, or the detail of a problem.
func (m *Middleware) key(r *http.Request, values []string) (key, detail string) {
	switch {
	case len(values) == 0:
		return "", fmt.Sprintf("%s %s requires an %s header: send a unique key (a V4 UUID, say) and reuse it when you retry.",
			r.Method, r.URL.Path, m.cfg.Header)
	case len(values) > 1:
		return "", fmt.Sprintf("The %s header must appear once; it appears %d times.", m.cfg.Header, len(values))
	}
	key, err := parseKey(values[0])
	if err != nil {
		return "", describeKeyError(m.cfg.Header, err)
	}
	return key, ""
}

// readBody reads the body in full, bounded, and puts it back for the
// handler. It answers the request itself and returns false when it cannot.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		m.writeProblem(w, idempotency.Outcome(adapter.BodyTooLarge),
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxRequestBody), 0)
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
			m.writeProblem(w, idempotency.Outcome(adapter.BodyUnreadable), "The request body could not be read in full.", 0)
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

// replay answers with a stored response, plus Idempotent-Replayed: true.
func (m *Middleware) replay(w http.ResponseWriter, result []byte, rq *serve.Request) {
	s, err := decodeResponse(result)
	if err != nil {
		rq.Done(idempotency.OutcomeCorruptRecord, fmt.Errorf("stored response of a completed key: %w", err))
		m.writeProblem(w, idempotency.OutcomeCorruptRecord,
			"The request with this key completed, but its stored response cannot be read.", 0)
		return
	}
	rq.Done(idempotency.OutcomeDuplicate, nil)
	if s.BodyOmitted {
		m.writeProblem(w, idempotency.OutcomeOutputNotStored,
			fmt.Sprintf("The request with this key completed with status %d, but its response (%d bytes) was too large to store and cannot be replayed. Do not retry with a new key: look the result up instead.",
				s.Status, s.BodySize), s.Status)
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

// run executes the handler as the key's owner, then records FAILED after a
// 5xx, else COMPLETED with the response, also when the client left.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, lease *idempotency.Lease, rq *serve.Request) {
	rec := newRecorder(w, m.maxBody)
	if !rq.Run(lease, func(ctx context.Context) string {
		next.ServeHTTP(rec, r.WithContext(serve.WithForwardKey(ctx, m.cfg.KeyPrefix, rq.Key)))
		return strconv.Itoa(cmp.Or(rec.status, http.StatusOK))
	}) {
		return
	}
	resp := rec.response()
	if resp.Status >= 500 {
		rq.Fail(lease, fmt.Errorf("handler answered %d", resp.Status))
		return
	}
	if resp.BodyOmitted {
		m.logger.Info("Response too large to store; repeats will be answered 410", watermill.LogFields{"idempotency_key": rq.Key,
			"status": resp.Status, "body_size": resp.BodySize, "max_output_size": m.maxBody})
	}
	cerr := m.complete(rec, lease, resp.encode())
	rq.Done(idempotency.OutcomeOf(cerr), cerr)
}

// complete records COMPLETED with result. Lease.Complete retries until the
// lease runs out; after flushAfter the response is flushed meanwhile.
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
