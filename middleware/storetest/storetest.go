package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Subject is one store under test.
type Subject struct {
	// Store is the store under test, fresh or shared: the suite's keys are
	// unique to each subtest.
	Store idempotency.Store
	// Advance moves the store's clock forward by d. Nil means the store keeps
	// real time, and the suite sleeps instead.
	Advance func(d time.Duration)
	// PutForeign writes under key a value of kind (one of Foreigns) that is
	// not a record, as a bug or another program would. Nil for a store with
	// no encoding anyone else could write (memstore): the case is skipped.
	PutForeign func(key, kind string) error
	// FreshClaimTimes is how far the times that a claim of an absent key
	// reports may be from the ones the store keeps for it, which Get reads.
	// Zero means they are the same (to the millisecond): the store read its
	// clock to answer. A store whose fresh claim answers without reading
	// its clock (redisstore's plain SET) reports the client's clock at the
	// send, which is behind the store's by the time the command took to
	// arrive, plus any skew between the hosts' clocks.
	FreshClaimTimes time.Duration
}

// Foreigns lists the kinds of value, not records, that Subject.PutForeign
// writes: a short string such as "1", a string longer than any record
// header, a JSON document, a value of a type the store never uses for a
// record (a Redis list), and a value of the record's type whose fields do
// not parse.
var Foreigns = []string{"short-string", "long-string", "json", "wrong-type", "bad-fields"}

// lease is the lease of the suite's claims; long enough that scheduling noise
// on a loaded machine never expires one early, short enough to sleep through.
const lease = 300 * time.Millisecond

// past is how far the suite moves time to be sure a lease or TTL has expired.
const past = lease + 100*time.Millisecond

// ttl is the TTL of the suite's records: how long a COMPLETED or FAILED
// record is kept, and how long a claim's record outlives its lapsed lease.
const ttl = lease

// keyInMessage is how many leading bytes of a key an error must quote: a
// store may shorten a long key in its messages, but must name it.
const keyInMessage = 40

// Run runs the conformance suite against the stores that newStore returns,
// one per subtest. Subtests run in parallel.
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
