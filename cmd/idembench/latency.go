package main

import (
	"fmt"
	"log"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// latencyRule is how the latency section decides its target, in the words
// printed beside it.
const latencyRule = "met when the median with auto-pipelining is at most the slowest round without it " +
	"(within the spread of the rounds without it, or faster)"

// Latency is the fresh c=1 cell of ours on Redis, run Rounds times with the
// store's auto-pipelining off and Rounds times with it on, alternating
// (off, on, on, off, off, on, ...), so that a lone caller's latency with
// auto-pipelining can be read against the spread of the runs without it.
type Latency struct {
	Rounds int `json:"rounds"`
	// Seconds is the measuring time of each round.
	Seconds float64 `json:"seconds"`
	// Off and On are the rounds without and with auto-pipelining.
	Off Spread `json:"off"`
	On  Spread `json:"on"`
	// Rule says when the target is met; Met says whether it is.
	Rule string `json:"rule"`
	Met  bool   `json:"met"`
}

// Spread is the time per message of several rounds of one cell, in µs.
type Spread struct {
	// Micros holds each round's time per message, in the order run.
	Micros []float64 `json:"micros"`
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
}

func newSpread(micros []float64) Spread {
	s := Spread{Micros: micros}
	if len(micros) == 0 {
		return s
	}
	sorted := slices.Sorted(slices.Values(micros))
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	if m := len(sorted) / 2; len(sorted)%2 == 1 {
		s.Median = sorted[m]
	} else {
		s.Median = (sorted[m-1] + sorted[m]) / 2
	}
	return s
}

// latencyMet applies latencyRule.
func latencyMet(off, on Spread) bool {
	return len(off.Micros) > 0 && len(on.Micros) > 0 && on.Median <= off.Max
}

func runLatency(o options, rc *redis.Client) Latency {
	warmPool(rc, 4)
	chains := make([]message.HandlerFunc, 2) // [0]: auto-pipelining off, [1]: on
	var seq atomic.Uint64
	prefix := o.prefix + "-lat"
	for i := range chains {
		idem := newIdempotency(idemConfig{Store: newRedisStore(rc, i == 0), KeyPrefix: prefix + strconv.Itoa(i),
			CompletedTTL: time.Hour}, false)
		chains[i] = idem.Middleware(noop)
		// One message first: the scripts are loaded, nothing below pays for it.
		if _, err := chains[i](message.NewMessage(fmt.Sprint("warm", i), nil)); err != nil {
			log.Fatalf("latency: %v", err)
		}
	}
	micros := make([][]float64, 2)
	for r := range o.rounds {
		// Off then on, then on then off: a drift of the machine's speed
		// during the run favours neither.
		for j := range chains {
			i := j
			if r%2 == 1 {
				i = 1 - j
			}
			n, secs := hammer(1, o.chainDur, func() error {
				_, err := chains[i](message.NewMessage("f"+strconv.FormatUint(seq.Add(1), 10), nil))
				return err
			})
			if n > 0 {
				micros[i] = append(micros[i], 1e6*secs/float64(n))
			}
			o.logf("latency round %d auto-pipelining %v: %d messages in %.2fs", r+1, i == 1, n, secs)
		}
	}
	cleanup(rc, prefix)
	lat := Latency{Rounds: o.rounds, Seconds: o.chainDur.Seconds(), Off: newSpread(micros[0]), On: newSpread(micros[1]), Rule: latencyRule}
	lat.Met = latencyMet(lat.Off, lat.On)
	return lat
}
