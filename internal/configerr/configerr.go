package configerr

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// List collects the problems of one Config, in the order they are added.
// The zero List is not usable: build it with New.
type List struct {
	invalid error
	errs    []error
}

// New returns an empty List whose problems match invalid, the package's
// ErrInvalidConfig.
func New(invalid error) *List { return &List{invalid: invalid} }

// Addf adds a problem that reads as invalid's message, ": " and the
// formatted text; the text may wrap further errors with %w.
func (l *List) Addf(format string, args ...any) {
	l.errs = append(l.errs, fmt.Errorf("%w: "+format, append([]any{l.invalid}, args...)...))
}

// Add adds err, a problem that already names itself (it wraps a sentinel
// of its own, such as ErrNilStore): its message is kept, and it matches
// invalid as well.
func (l *List) Add(err error) { l.errs = append(l.errs, problem{err: err, invalid: l.invalid}) }

// Err returns nil when no problem was added, else every problem joined
// with errors.Join, one per line, in the order they were added.
func (l *List) Err() error { return errors.Join(l.errs...) }

// problem is an error of its own that is also an invalid config.
type problem struct{ err, invalid error }

func (p problem) Error() string   { return p.err.Error() }
func (p problem) Unwrap() []error { return []error{p.err, p.invalid} }

// NotNegative adds "name is v, must not be negative" when v is below zero:
// the rule of every size, count and duration whose zero value stands for its
// default.
func NotNegative[T ~int | ~int64](l *List, name string, v T) {
	if v < 0 {
		l.Addf("%s is %v, must not be negative", name, v)
	}
}

// MinLease is the shortest lease the owner protocol accepts: it renews
// every third of the lease, so that a renewal is at least a millisecond
// apart from the next.
const MinLease = 3 * time.Millisecond

// Renewable adds a problem when the setting LeaseTTL, set (not zero), is
// shorter than MinLease.
func Renewable(l *List, leaseTTL time.Duration) {
	if leaseTTL > 0 && leaseTTL < MinLease {
		l.Addf("LeaseTTL %v is too short to renew every LeaseTTL/3", leaseTTL)
	}
}

// MaxTTL is the longest lease or TTL a Config accepts: 100 years (365-day
// years), "forever" for any record. Every store can hold it, and twice it,
// without overflow: Redis PX takes up to 2^63-1 ms less the server's clock,
// a PostgreSQL timestamp reaches the year 294276, and a Go time.Duration
// (what a store adds to its own clock) spans 292 years.
const MaxTTL = 100 * 365 * 24 * time.Hour

// TTL adds "name is v, must not be negative" when v is below zero, and
// "name is v, longer than MaxTTL" when v is above MaxTTL: a lease or a
// TTL, whose zero value stands for its default.
func TTL(l *List, name string, v time.Duration) {
	switch {
	case v < 0:
		NotNegative(l, name, v)
	case v > MaxTTL:
		l.Addf("%s is %v, must be at most %v (100 years; there is no \"no expiry\")", name, v, MaxTTL)
	}
}

// KeySeparator ends the prefix of every stored key, and its scope.
const KeySeparator = ':'

// KeyPrefix adds a problem when prefix holds KeySeparator: the stored key
// is prefix:scope:key, and a colon in the prefix would let one prefix,
// scope and key pair store under the key of another ("a:b", "c", "k" and
// "a", "b", "c:k" are both "a:b:c:k").
func KeyPrefix(l *List, prefix string) {
	if strings.IndexByte(prefix, KeySeparator) >= 0 {
		l.Addf("KeyPrefix %q holds %q, the separator of prefix:scope:key; use another character (%q, say)",
			prefix, string(KeySeparator), strings.ReplaceAll(prefix, string(KeySeparator), "."))
	}
}
