package httpidem

import "github.com/idempotency/watermill-idempotency/middleware/internal/adapter"

// The key errors that package adapter defines, as the internal tests name them.
var errKeyEmpty, errKeyNotPrint = adapter.ErrKeyEmpty, adapter.ErrKeyNotPrintable

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
