// Package storetest is the conformance suite of [idempotency.Store]. Every
// store of this module runs it, and so can any third-party store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Subject {
//			return storetest.Subject{Store: newMyStore(t)}
//		})
//	}
//
// The suite proves the state machine of [idempotency.Store]:
//
//   - Claim: one winner among 64 concurrent claimers; a live lease is refused.
//   - Fencing: another token, or a lapsed owner, gets [idempotency.ErrLeaseLost].
//   - Renew of the owner's own COMPLETED key gets [idempotency.ErrCompletedByOwner].
//   - A lapsed lease reads FAILED; the next claim counts one more attempt.
//   - Resent transitions succeed for their owner and change nothing.
//   - Release undoes a claim whose outcome the caller never learned.
//   - COMPLETED and FAILED records expire after their TTL.
//   - Leases and TTLs up to time.Duration(math.MaxInt64) hold the key.
//   - Results and keys of any bytes round-trip exactly; fingerprints fence.
//   - [idempotency.Once.Do] on the store runs each key's work once.
//   - A value that is not a record is [idempotency.ErrCorruptRecord] for
//     every method, and stays; Delete removes it (with Subject.PutForeign).
//   - Delete, cancelled contexts, and bad arguments, which change nothing.
//
// docs/GUARANTEES.md ("What storetest checks") lists every check.
//
// The store's clock is read through the times it reports, never compared
// with the test's wall clock. A fresh claim's times may differ from the
// kept ones by Subject.FreshClaimTimes.
//
// [Benchmark] measures a store alone, to compare a store with the built-in
// ones on one machine.
//
// Keys are unique per run and subtest; the suite deletes what it wrote and
// never flushes. With a real clock, leases are 300 ms and cases sleep (at
// most about 1.5 s, in parallel); Subject.Advance makes the suite never
// sleep.
package storetest
