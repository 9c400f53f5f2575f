package adapter

import (
	"context"
	"errors"
	"time"
)

// DefaultRetryAfter is how long a client is told to wait before it retries
// a key in progress, or a store that cannot be reached.
const DefaultRetryAfter = time.Second

// RunHandler calls handler as the key's owner, under lease. Should handler
// panic, the key is FAILED (lease.Fail), panicked counts and logs that, and
// the panic goes on to the outer recovery (or net/http, or crashes a gRPC
// server without one), as if the adapter were absent.
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

type labelKey struct{}

// WithLabel returns ctx carrying label, the Observer's label of the
// adapter's outcomes, for the cache lookup of a claim made under ctx.
func WithLabel(ctx context.Context, label string) context.Context {
	return context.WithValue(ctx, labelKey{}, label)
}

// Label returns the label of WithLabel in ctx, or "".
func Label(ctx context.Context) string {
	l, _ := ctx.Value(labelKey{}).(string)
	return l
}
