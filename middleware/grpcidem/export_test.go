package grpcidem

import "github.com/idempotency/watermill-idempotency/middleware/internal/adapter"

// StoreKey is adapter.StoreKey, for the external tests that look records
// up in the store.
var StoreKey = adapter.StoreKey

// Retryable is isRetryable, for the table of the status mapping.
var Retryable = isRetryable
