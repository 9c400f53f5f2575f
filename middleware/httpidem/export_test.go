package httpidem

// StoreKey is the stored key of (scope, key) under prefix, for the
// external tests that look records up in the store.
var StoreKey = storeKey

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
