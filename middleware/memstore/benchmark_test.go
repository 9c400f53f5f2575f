package memstore_test

import (
	"testing"

	"github.com/idempotency/watermill-idempotency/middleware/memstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// The store alone, without the middleware (storetest.Benchmark).
//
//	go test -run '^$' -bench . -benchmem ./middleware/memstore/
func BenchmarkStore(b *testing.B) {
	s := memstore.New(nil)
	storetest.Benchmark(b, s, "")
}
