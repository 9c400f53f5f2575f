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
	// ErrLeaseLost is returned by Renew, Complete and Fail when the caller's
	// owner token is no longer the key's owner: the lease expired and the key
	// was claimed again, completed, failed or deleted. It is also the cause
	// (context.Cause) of a work's context cancelled because its lease was
	// lost, so that the work can tell that from its own deadline.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrCompletedByOwner is returned by Renew when the key is COMPLETED by
	// the renewing token's own Complete: the lease ended because its owner
	// completed the key (inside its own database transaction, typically,
	// which committed while the renewal waited for it), not because anyone
	// else took it. It does not match ErrLeaseLost.
	ErrCompletedByOwner = errors.New("idempotency: key completed by the renewing owner")
	// ErrCorruptRecord is returned, wrapped with the key, when the value
	// under a key is not a well-formed record: a foreign value, a value of
	// the wrong type, a damaged encoding. The store changes nothing; the
	// middleware nacks, the HTTP middleware answers 500, and an operator
	// must look at the key (and delete it to let the message run).
	ErrCorruptRecord = errors.New("idempotency: corrupt record")
)

// ErrInvalidConfig is matched by every problem that [NewOnce] and [New]
// report. They report all problems at once, joined in the order of the
// fields.
var ErrInvalidConfig = errors.New("idempotency: invalid config")

// Errors returned by the Watermill middleware to the router. The permanent
// ones (see IsPermanent) mean that redelivering the message cannot help: route
// them to a poison queue.
var (
	// ErrMissingKey means the message has no key: none of the metadata
	// fields, no UUID, or an empty result of Config.KeyFunc. Permanent.
	ErrMissingKey = errors.New("idempotency: message has no idempotency key")
	// ErrInProgress means another consumer holds a live lease on the key; the
	// message is nacked so that the broker delivers it again later.
	ErrInProgress = errors.New("idempotency: key is in progress elsewhere")
	// ErrTooManyAttempts means the key's handler already failed
	// OnceConfig.MaxAttempts times; the handler is not run again. Permanent.
	ErrTooManyAttempts = errors.New("idempotency: too many attempts")
	// ErrKeyReused means the key was first seen with a different payload
	// (Config.CheckPayload): the producer reused a key for other work.
	// Permanent.
	ErrKeyReused = errors.New("idempotency: key reused with a different payload")
	// ErrStoreUnavailable wraps a store error that kept the middleware from
	// deciding; the message is nacked (unless OnceConfig.FailOpen).
	ErrStoreUnavailable = errors.New("idempotency: store unavailable")
)

// errOutputNotStored is reported with OutcomeOutputNotStored, wrapped with
// the output's size. It never reaches the router: the handler succeeded.
var errOutputNotStored = errors.New("idempotency: output too large to store; a duplicate will not republish it")

// errCallerGone is in the chain of a claim's error when the caller's
// context had ended when the store call returned: OutcomeOf names it
// OutcomeCallerGone. It is judged before the release of the failed claim,
// which may wait on the store again.
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
