package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemType names each answer the middleware gives itself, as an RFC 9457
// problem (Content-Type application/problem+json, members type, title,
// status and detail). The problem's "type" is Config.ProblemTypeBase followed
// by the ProblemType, which by default is the URL of the constant's
// documentation below.
type ProblemType string

const (
	// ProblemKeyMissing (400): the method requires the Idempotency-Key header
	// and the request has none.
	ProblemKeyMissing ProblemType = "ProblemKeyMissing"
	// ProblemKeyInvalid (400): the key is empty, longer than MaxKeyLength,
	// holds a byte outside printable ASCII, is a malformed quoted string,
	// holds a comma without being quoted, or the header appears more than
	// once.
	ProblemKeyInvalid ProblemType = "ProblemKeyInvalid"
	// ProblemBodyUnreadable (400): the request body could not be read.
	ProblemBodyUnreadable ProblemType = "ProblemBodyUnreadable"
	// ProblemBodyTooLarge (413): the request body exceeds MaxRequestBody.
	ProblemBodyTooLarge ProblemType = "ProblemBodyTooLarge"
	// ProblemInProgress (409, with Retry-After): a request with this key is
	// still running. Retry later with the same key.
	ProblemInProgress ProblemType = "ProblemInProgress"
	// ProblemKeyReused (422): the key was first used for a different request
	// (method, path, query or body). Use a new key for a new request.
	ProblemKeyReused ProblemType = "ProblemKeyReused"
	// ProblemResponseNotStored (410): the request with this key completed,
	// but its response exceeded MaxResponseBody and cannot be replayed. The
	// effect happened: do not retry with a new key; look the result up
	// instead. The member "original_status" holds the first response's
	// status.
	ProblemResponseNotStored ProblemType = "ProblemResponseNotStored"
	// ProblemStoreUnavailable (503, with Retry-After): the idempotency store
	// could not be reached and FailOpen is off; the handler did not run.
	ProblemStoreUnavailable ProblemType = "ProblemStoreUnavailable"
	// ProblemStoredResponseCorrupt (500): the request with this key
	// completed, but its stored response could not be decoded. The handler
	// is not run again.
	ProblemStoredResponseCorrupt ProblemType = "ProblemStoredResponseCorrupt"
	// ProblemRecordCorrupt (500): the value kept under this key in the
	// idempotency store is not a record of the store's
	// (idempotency.ErrCorruptRecord): whether the request already ran cannot
	// be known, so the handler does not run. Retrying with the same key
	// gets the same answer until an operator inspects and deletes the key,
	// which the server logs.
	ProblemRecordCorrupt ProblemType = "ProblemRecordCorrupt"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail"`
	OriginalStatus int    `json:"original_status,omitempty"`
}

var problemTitles = map[ProblemType]string{
	ProblemKeyMissing:            "Idempotency-Key is missing",
	ProblemKeyInvalid:            "Idempotency-Key is invalid",
	ProblemBodyUnreadable:        "Request body could not be read",
	ProblemBodyTooLarge:          "Request body is too large",
	ProblemInProgress:            "A request with this Idempotency-Key is in progress",
	ProblemKeyReused:             "Idempotency-Key reused for a different request",
	ProblemResponseNotStored:     "Response of this Idempotency-Key was not stored",
	ProblemStoreUnavailable:      "Idempotency store unavailable",
	ProblemStoredResponseCorrupt: "Stored response could not be read",
	ProblemRecordCorrupt:         "Idempotency record could not be read",
}

// writeProblem answers with a problem; 409 and 503 carry Retry-After.
func (m *Middleware) writeProblem(w http.ResponseWriter, status int, pt ProblemType, detail string, extra func(*problem)) {
	p := problem{
		Type:   m.cfg.ProblemTypeBase + string(pt),
		Title:  problemTitles[pt],
		Status: status,
		Detail: detail,
	}
	if extra != nil {
		extra(&p)
	}
	body, _ := json.Marshal(p) // a struct of strings and ints always marshals
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if status == http.StatusConflict || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", retryAfterSeconds(m.cfg.RetryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}
