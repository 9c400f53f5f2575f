package backends_test

// The tests of this package run on every broker: they link them all.
import _ "github.com/idempotency/watermill-idempotency/backends/all"
