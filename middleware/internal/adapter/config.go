package adapter

import (
	"errors"
	"strconv"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/configerr"
)

// DefaultRetryAfter is how long a client is told to wait before it retries
// a key in progress, or a store that cannot be reached.
const DefaultRetryAfter = time.Second

// CheckCommon adds to l the problems of the fields every adapter's Config
// has. what names what a Scope is the tenant of: "request" or "call".
func CheckCommon(l *configerr.List, what string, hasScope, singleTenant bool, retryAfter time.Duration, keyPrefix string) {
	switch {
	case !hasScope && !singleTenant:
		l.Addf("Scope is required (the tenant of a %s); set SingleTenant instead only when one client calls this service", what)
	case hasScope && singleTenant:
		l.Addf("Scope and SingleTenant are both set; choose one")
	}
	configerr.NotNegative(l, "RetryAfter", retryAfter)
	configerr.KeyPrefix(l, keyPrefix)
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1: the HTTP
// Retry-After.
func RetryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

// RunHandler calls handler as the key's owner, under lease. Should handler
// panic, the key is FAILED (lease.Fail), panicked counts and logs that, and
// the panic goes on to the outer recovery, as if the adapter were absent.
func RunHandler(lease interface{ Fail() }, panicked func(err error), handler func()) {
	finished := false
	defer func() {
		if !finished {
			lease.Fail()
			panicked(errors.New("handler panicked"))
		}
	}()
	handler()
	finished = true
}
