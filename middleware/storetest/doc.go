// Package storetest is the conformance suite of middleware.Store. Every
// store of this module runs it, and so can any third-party store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Subject {
//			return storetest.Subject{Store: newMyStore(t)}
//		})
//	}
//
// The suite proves the state machine of middleware.Store: exactly one winner
// among 64 concurrent claimers (over 100 rounds), fencing of stale owners
// with ErrLeaseLost, lease renewal, attempts counted across failures, expiry
// of every state, exact round trips of empty and 1 MiB results, keys of any
// bytes (1 MiB long, NUL, newlines, quotes, braces, Lua metacharacters,
// invalid UTF-8), fingerprints, cancelled contexts, and rejection of empty
// keys and of TTLs that are not positive.
//
// Benchmark measures a store alone (claim+complete of a fresh key, claim of
// a completed key), so a third-party store can be compared with the
// built-in ones on the same machine.
//
// Keys are unique per run and per subtest, so the suite may share a server
// with other data; it deletes what it wrote and never flushes anything.
// Stores with a real clock are driven with leases of a few hundred
// milliseconds and real sleeps; a store with an injectable clock passes
// Subject.Advance and the suite never sleeps.
package storetest
