// Package callergone marks the error of a claim whose caller gave up: the
// caller's context had ended when the store call returned. The owner
// protocol (idempotency.Once) judges it there, before it releases the
// failed claim, which waits on the store up to StoreTimeout again: a
// caller whose deadline passes only during that release waited out
// StoreTimeout, and its claim is store_unavailable. The adapters count a
// marked error as idempotency.OutcomeCallerGone.
package callergone

import "errors"

// Err is in the chain of a claim's error when its caller was gone.
var Err = errors.New("the caller is gone")
