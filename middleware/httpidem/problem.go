package httpidem

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail"`
	OriginalStatus int    `json:"original_status,omitempty"`
}

// writeProblem answers with the problem of outcome, from adapter.Refusals.
func (m *Middleware) writeProblem(w http.ResponseWriter, outcome idempotency.Outcome, detail string, originalStatus int) {
	r := adapter.Refusals[string(outcome)]
	p := problem{Type: problemTypeBase + string(outcome), Title: r.Title, Status: r.HTTP, Detail: detail, OriginalStatus: originalStatus}
	body, _ := json.Marshal(p) // a struct of strings and ints always marshals
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if r.Retry {
		h.Set("Retry-After", adapter.RetryAfterSeconds(m.cfg.RetryAfter))
	}
	w.WriteHeader(r.HTTP)
	_, _ = w.Write(body)
}
