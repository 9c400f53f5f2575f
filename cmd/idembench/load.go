package main

import (
	"context"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// hammer calls f from c goroutines until d has passed, and returns the
// number of successful calls and the seconds they took.
func hammer(c int, d time.Duration, f func() error) (int64, float64) {
	var n atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range c {
		wg.Go(func() {
			for i := 0; ; i++ {
				if i%16 == 0 && time.Now().After(deadline) {
					return
				}
				if err := f(); err != nil {
					if !failed.Swap(true) {
						log.Printf("error under load: %v", err)
					}
					continue
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return n.Load(), time.Since(start).Seconds()
}

// forEach calls f once for each key, from conc goroutines.
func forEach(conc int, keys []string, f func(string)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(conc, len(keys)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				f(keys[i])
			}
		})
	}
	wg.Wait()
}

// warmPool opens n connections so that no measurement pays for dialling:
// it holds n connections of the pool at once, then gives them back.
func warmPool(rc *redis.Client, n int) {
	ctx := context.Background()
	conns := make([]*redis.Conn, n)
	for i := range conns {
		conns[i] = rc.Conn()
		_ = conns[i].Ping(ctx).Err()
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// maxInt returns the largest of xs, and at least 1.
func maxInt(xs []int) int {
	m := 1
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
