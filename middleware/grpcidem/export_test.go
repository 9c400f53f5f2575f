package grpcidem

// StoreKey is the stored key of (scope, key) under prefix, for the
// external tests that look records up in the store.
var StoreKey = storeKey

// Retryable is isRetryable, for the table of the status mapping.
var Retryable = isRetryable
