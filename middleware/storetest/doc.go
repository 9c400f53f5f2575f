// Package storetest is the conformance suite of idempotency.Store. Every
// store of this module runs it, and so can any third-party store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Subject {
//			return storetest.Subject{Store: newMyStore(t)}
//		})
//	}
//
// The suite proves the state machine of idempotency.Store:
//
//   - Claim: an absent key is acquired with the caller's token, attempt 1,
//     and a lease deadline lease after the claim; exactly one winner among 64
//     concurrent claimers, each with its own token (over 100 rounds), and
//     the key then holds the winner's token; a live lease of another owner
//     is refused without handing out its token.
//   - Fencing: Renew, Complete and Fail of any token but the holder's get
//     idempotency.ErrLeaseLost and change nothing; so do those of an owner
//     whose lease lapsed, whether or not someone claimed the key since.
//     The completing owner's Renew of its COMPLETED key gets
//     idempotency.ErrCompletedByOwner instead (not ErrLeaseLost), and
//     changes nothing: its lease ended, nobody took it.
//   - Lapsed leases: a lease not renewed in time reads as FAILED (no token,
//     its attempts, LeaseExpiresAt the lapsed deadline, now past); the next
//     claim acquires it as attempt n+1 with its creation time kept, so a
//     crash loop reaches MaxAttempts; the record expires TTL after its
//     deadline, and only then do attempts restart at 1. Renew moves the
//     deadline and the record's expiry with it.
//   - Resent transitions, as a client resends a command whose reply was
//     lost: a claim with the holding token acquires again without counting
//     an attempt and counts its lease from now; Renew, Complete and Fail
//     resent by their owner succeed, and a resent Complete keeps the first
//     result; another token's Complete or Fail, or the old owner's Fail after
//     the key was claimed again, gets ErrLeaseLost; COMPLETED is terminal,
//     even for the token that completed it; the token that failed a key holds
//     nothing, so its claim is a new attempt.
//   - Release, as a caller undoes a claim whose outcome it never learned:
//     a live lease of the releasing token is undone, so a first attempt's
//     key reads absent and is claimed next as attempt 1, and a later
//     attempt's reads FAILED with one attempt fewer, no token and no lease,
//     its creation time and fingerprint kept, is claimable again as the same
//     attempt, and expires the claim's TTL after the release; the released
//     owner's Renew, Complete and Fail get ErrLeaseLost, and so does the
//     resent Fail of the owner that failed the key before the released claim.
//     Release by another token, resent, of a lease that lapsed (which still
//     reads FAILED with its attempts and counts), of a COMPLETED key (even by
//     its completing token) or of an absent key returns nil and changes
//     nothing.
//   - Attempts counted across failures and kept by completion; expiry of
//     COMPLETED and FAILED records after their TTL; LeaseExpiresAt zero on
//     records completed or failed by their owner.
//   - Long leases and TTLs: idempotency.MaxTTL, just below and above it, and
//     time.Duration(math.MaxInt64) ("forever") for the lease, the claim's
//     TTL, Renew, Complete and Fail each hold the key (a lease beyond
//     MaxTTL for MaxTTL): a live lease stays unclaimable, a completed key
//     is not run again, a failed or lapsed attempt keeps counting, also
//     after a Release puts a later attempt back to FAILED for its claim's
//     TTL. No rounding overflows into an expiry in the past.
//   - Exact round trips of empty, nil, odd and 1 MiB results; keys of any
//     bytes (1 MiB long, NUL, newlines, quotes, braces, Lua metacharacters,
//     invalid UTF-8); fingerprints (a different one never acquires, the first
//     is kept).
//   - The owner protocol on the store (idempotency.Once.Do): one run per
//     key with its value replayed to later callers, a failure or a panic
//     runs again as the next attempt, a busy key is ErrInProgress, 16
//     concurrent callers run the work once, MaxAttempts stops it with
//     ErrTooManyAttempts, and a key deleted under a running owner cancels
//     its work with idempotency.ErrLeaseLost.
//   - Corrupt records, when Subject.PutForeign is set: for every Foreign
//     kind (short and long strings, JSON, a value of the wrong type, a record
//     with fields that do not parse), Claim, Get, Renew, Complete, Fail and
//     Release return an error matching idempotency.ErrCorruptRecord that names the
//     key; Claim never acquires and never reports a duplicate; the foreign
//     value is still there afterwards; Delete removes it and the key starts
//     afresh. A store without a foreign encoding (memstore) leaves
//     PutForeign nil, and the case logs that it does not apply.
//   - Delete of any state; cancelled contexts; rejection of empty keys and
//     tokens and of leases and TTLs that are not positive, changing nothing.
//
// The store's clock is read through the times it reports (a fresh key's
// UpdatedAt, as Get reads it, is its "now"), never compared with the test's
// own wall clock. The times a claim of an absent key reports are compared
// with the ones the store keeps within Subject.FreshClaimTimes.
//
// Benchmark measures a store alone (claim+complete of a fresh key, claim of
// a completed key), so a third-party store can be compared with the
// built-in ones on the same machine.
//
// Keys are unique per run and per subtest, so the suite may share a server
// with other data; it deletes what it wrote and never flushes anything.
// Stores with a real clock are driven with leases of 300 milliseconds and
// real sleeps (no case sleeps more than about 1.5 s, and cases run in
// parallel); a store with an injectable clock passes Subject.Advance and the
// suite never sleeps.
package storetest
