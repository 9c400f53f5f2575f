package storetest

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

// Benchmark measures a store alone: a fresh message is a Claim and a
// Complete of a new key, a duplicate a Claim of a completed key; each
// sequential and from 64 goroutines. Keys start with prefix:
//
//	func BenchmarkStore(b *testing.B) { storetest.Benchmark(b, newMyStore(b), "bench:") }
func Benchmark(b *testing.B, s idempotency.Store, prefix string) {
	ctx := context.Background()
	var seq atomic.Uint64
	fresh := func(b *testing.B) {
		key := prefix + "f" + strconv.FormatUint(seq.Add(1), 10)
		req := claimRequest()
		res, err := s.Claim(ctx, key, req)
		if err != nil || !res.Acquired {
			b.Fatalf("claim %s: %v %+v", key, err, res)
		}
		if err := s.Complete(ctx, key, req.Token, nil, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	dups := make([]string, 1024)
	for i := range dups {
		dups[i] = prefix + "d" + strconv.Itoa(i)
		req := claimRequest()
		if _, err := s.Claim(ctx, dups[i], req); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, dups[i], req.Token, nil, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	var dseq atomic.Uint64
	duplicate := func(b *testing.B) {
		res, err := s.Claim(ctx, dups[dseq.Add(1)%uint64(len(dups))], claimRequest())
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

// claimRequest is the benchmark's claim, with OnceConfig's defaults.
func claimRequest() idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: 40 * time.Second, TTL: 24 * time.Hour}
}
