package idempotency

import (
	"errors"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// Errors of a [Store] for arguments no store accepts; storetest checks them.
var (
	// ErrEmptyKey is returned for an empty key.
	ErrEmptyKey = storekit.ErrEmptyKey
	// ErrInvalidTTL is returned for a lease or TTL that is not positive.
	ErrInvalidTTL = storekit.ErrInvalidTTL
	// ErrEmptyToken is returned for an empty owner token.
	ErrEmptyToken = storekit.ErrEmptyToken
)

// Errors returned by stores that reach their users through Once and the
// adapters. Check them with errors.Is: stores wrap them with the operation
// and key.
var (
	// ErrLeaseLost is returned by Renew, Complete and Fail when the token no
	// longer owns the key. It is the cause of a work's context cancelled
	// for a lost lease.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrCompletedByOwner is returned by Renew when the renewing token
	// completed the key itself (in its own transaction, typically). It does
	// not match ErrLeaseLost.
	ErrCompletedByOwner = errors.New("idempotency: key completed by the renewing owner")
	// ErrCorruptRecord is returned, wrapped with the key, when the value
	// under a key is not a record. The store changes nothing; an operator
	// deletes the key.
	ErrCorruptRecord = errors.New("idempotency: corrupt record")
)

// ErrInvalidConfig is matched by every problem [NewOnce] and [New] report,
// all at once.
var ErrInvalidConfig = errors.New("idempotency: invalid config")

// Errors returned by the Watermill middleware. The permanent ones
// ([IsPermanent]) belong in a poison queue.
var (
	// ErrMissingKey means the message has no key. Permanent.
	ErrMissingKey = errors.New("idempotency: message has no idempotency key")
	// ErrInProgress means another consumer holds the key's live lease.
	ErrInProgress = errors.New("idempotency: key is in progress elsewhere")
	// ErrTooManyAttempts means the work failed MaxAttempts times. Permanent.
	ErrTooManyAttempts = errors.New("idempotency: too many attempts")
	// ErrKeyReused means the key came with another payload
	// (Config.CheckPayload). Permanent.
	ErrKeyReused = errors.New("idempotency: key reused with a different payload")
	// ErrStoreUnavailable wraps a store error that kept the claim from deciding.
	ErrStoreUnavailable = errors.New("idempotency: store unavailable")
)

// errOutputNotStored is reported with OutcomeOutputNotStored, wrapped with
// the output's size. It never reaches the router: the handler succeeded.
var errOutputNotStored = errors.New("idempotency: output too large to store; a duplicate will not republish it")

// errCallerGone marks a claim's error when the caller's context had ended
// as the store call returned: OutcomeCallerGone.
var errCallerGone = errors.New("the caller is gone")

// IsPermanent reports whether err means that redelivery cannot help
// (ErrMissingKey, ErrTooManyAttempts or ErrKeyReused). Pass it to Watermill's
// PoisonQueueWithFilter, added before this middleware:
//
//	poison, _ := middleware.PoisonQueueWithFilter(pub, "poison", idempotency.IsPermanent)
//	router.AddMiddleware(poison, idem.Middleware)
func IsPermanent(err error) bool {
	return errors.Is(err, ErrMissingKey) || errors.Is(err, ErrTooManyAttempts) || errors.Is(err, ErrKeyReused)
}
