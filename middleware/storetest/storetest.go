package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Subject is one store under test.
type Subject struct {
	// Store is the store under test, fresh or shared.
	Store idempotency.Store
	// Advance moves the store's clock by d. Nil: the suite sleeps.
	Advance func(d time.Duration)
	// PutForeign writes under key a value of kind (one of Foreigns) that is
	// not a record, as a bug or another program would. Nil for a store with
	// no encoding anyone else could write (memstore): the case is skipped.
	PutForeign func(key, kind string) error
	// FreshClaimTimes is how far a fresh claim's reported times may be from
	// the kept ones. Zero means within a millisecond. A store that answers
	// without reading its clock (redisstore) reports the client's.
	FreshClaimTimes time.Duration
}

// Foreigns lists the kinds for Subject.PutForeign: a short string ("1"), a
// string longer than any header, JSON, a value of a type the store never
// uses (a Redis list), and a record whose fields do not parse.
var Foreigns = []string{"short-string", "long-string", "json", "wrong-type", "bad-fields"}

// lease is the lease of the suite's claims.
const lease = 300 * time.Millisecond

// past is how far the suite moves time to be sure a lease or TTL has expired.
const past = lease + 100*time.Millisecond

// ttl is the TTL of the suite's records and claims.
const ttl = lease

// keyInMessage is how many leading bytes of a key an error must quote.
const keyInMessage = 40

// Run runs the conformance suite on the stores newStore returns, one per
// subtest, in parallel.
func Run(t *testing.T, newStore func(t *testing.T) Subject) {
	run := randomHex(8)
	for _, tc := range append(cases[:len(cases):len(cases)], onceCases...) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			h := &harness{t: t, Subject: s, ctx: context.Background(),
				prefix: "storetest:" + run + ":" + tc.name + ":"}
			t.Cleanup(h.cleanup)
			tc.fn(h)
		})
	}
}

var cases = []struct {
	name string
	fn   func(h *harness)
}{
	{"ClaimAbsentAcquires", testClaimAbsent},
	{"ClaimRaceHasOneWinner", testClaimRace},
	{"ClaimInProgressIsRefused", testClaimInProgress},
	{"CompleteStoresResult", testComplete},
	{"ResultRoundTrip", testResultRoundTrip},
	{"StaleOwnerIsFenced", testStaleOwner},
	{"RenewExtendsLease", testRenew},
	{"ExpiredLeaseIsClaimable", testLeaseExpiry},
	{"LapsedLeaseKeepsAttempts", testLapsedLease},
	{"FailCountsAttempts", testFailAttempts},
	{"ResentTransitionsAreIdempotent", testResent},
	{"ReleaseUndoesAClaim", testRelease},
	{"CompletedExpires", testCompletedExpires},
	{"FailedExpires", testFailedExpires},
	{"LongTTLsHold", testLongTTLs},
	{"LongTTLRelease", testLongTTLRelease},
	{"OddKeys", testOddKeys},
	{"Fingerprint", testFingerprint},
	{"CorruptRecords", testCorrupt},
	{"Delete", testDelete},
	{"CancelledContext", testCancelledContext},
	{"BadArguments", testBadArguments},
}
