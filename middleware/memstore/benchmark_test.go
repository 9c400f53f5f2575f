package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// The store alone, without the middleware: one fresh message is Claim then
// Complete; one duplicate is a Claim of a completed key.
//
//	go test -run '^$' -bench . -benchmem ./middleware/memstore/
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	s := memstore.New(memstore.Config{})
	b.Cleanup(func() { _ = s.Close() })
	var seq atomic.Uint64
	fresh := func(b *testing.B) {
		key := "f" + strconv.FormatUint(seq.Add(1), 10)
		res, err := s.Claim(ctx, key, time.Minute, nil)
		if err != nil || !res.Acquired {
			b.Fatalf("claim %s: %v %+v", key, err, res)
		}
		if err := s.Complete(ctx, key, res.Token, nil, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	dups := make([]string, 1024)
	for i := range dups {
		dups[i] = "d" + strconv.Itoa(i)
		res, _ := s.Claim(ctx, dups[i], time.Minute, nil)
		_ = s.Complete(ctx, dups[i], res.Token, nil, time.Hour)
	}
	var dseq atomic.Uint64
	duplicate := func(b *testing.B) {
		res, err := s.Claim(ctx, dups[dseq.Add(1)%1024], time.Minute, nil)
		if err != nil || res.Acquired {
			b.Fatalf("duplicate claim: %v %+v", err, res)
		}
	}
	for _, load := range []struct {
		name string
		op   func(*testing.B)
	}{{"fresh", fresh}, {"duplicate", duplicate}} {
		b.Run(load.name+"/seq", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				load.op(b)
			}
		})
		b.Run(load.name+"/c64", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					load.op(b)
				}
			})
		})
	}
}
