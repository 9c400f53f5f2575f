package pgstore_test

import (
	"testing"

	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// The store alone on the shared PostgreSQL (PG_URL; fails when it is down,
// skipped under -short), without the middleware (storetest.Benchmark), on a
// table of its own that is dropped afterwards.
//
//	go test -run '^$' -bench . -benchmem ./middleware/pgstore/
func BenchmarkStore(b *testing.B) {
	s, _ := newTable(b, testPool(b))
	storetest.Benchmark(b, s, "bench:")
}
