package middleware

import "errors"

// Errors returned by stores. Check them with errors.Is: stores wrap them with
// the operation and key.
var (
	// ErrLeaseLost is returned by Renew, Complete and Fail when the caller's
	// owner token is no longer the key's owner: the lease expired and the key
	// was claimed again, completed, failed or deleted.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrEmptyKey is returned for an empty key.
	ErrEmptyKey = errors.New("idempotency: empty key")
	// ErrInvalidTTL is returned for a lease or TTL that is zero or negative.
	ErrInvalidTTL = errors.New("idempotency: lease and TTL must be positive")
	// ErrEmptyToken is returned by Renew, Complete and Fail for an empty owner token.
	ErrEmptyToken = errors.New("idempotency: empty owner token")
)
