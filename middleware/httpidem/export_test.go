package httpidem

import "github.com/idempotency/watermill-idempotency/middleware/internal/adapter"

// StoreKey is adapter.StoreKey, for the external tests that look records
// up in the store.
var StoreKey = adapter.StoreKey

// Attempt and Verdict are the tests' view of one attempt of a Transport.
type (
	Attempt = attempt
	Verdict = verdict
)

const (
	VerdictDone      = verdictDone
	VerdictRetry     = verdictRetry
	VerdictUnsafe    = verdictUnsafe
	VerdictExhausted = verdictExhausted
	VerdictTooLong   = verdictTooLong
)

// Observe makes t call f after every attempt, before its first call.
func Observe(t *Transport, f func(Attempt)) { t.observe = f }
