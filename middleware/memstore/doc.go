// Package memstore is an in-process idempotency.Store: the same state machine
// and guarantees as the Redis store, for one process only. It is the
// reference semantics of idempotency.Store: storetest.Run states them as
// tests, and memstore is the simplest code that passes them.
//
// It is the embedded default of the examples and of tests that need no
// server. It is never a silent default for production: its records live in
// one process's memory, so two consumers (or one restarted consumer) do not
// see each other's keys, and a crash loses every COMPLETED record.
//
// # Semantics
//
//   - Every transition is atomic under one mutex; exactly one of any number of
//     concurrent claimers acquires a key.
//   - Claim installs the caller's token (idempotency.ClaimRequest.Token). The
//     lease deadline is kept in the record, and the record is kept until the
//     deadline plus the request's TTL; Renew moves both. A lease whose
//     deadline has passed has lapsed: the record reads as FAILED (no token,
//     LeaseExpiresAt the lapsed deadline, attempts kept), its old owner's
//     Renew, Complete and Fail get idempotency.ErrLeaseLost, and the next
//     Claim acquires it as attempt n+1 with the creation time kept. So an
//     owner that dies mid-run still counts its attempt.
//   - Resent transitions are idempotent: a Claim with the token that holds a
//     live lease acquires again without counting an attempt (the lease then
//     counts from now); a COMPLETED or FAILED record keeps, unreported, the
//     token whose Complete or Fail made it so, and that token's Complete (or
//     Fail) again returns nil and changes nothing; its Renew of the
//     COMPLETED record gets idempotency.ErrCompletedByOwner. Any other
//     token gets ErrLeaseLost. COMPLETED is terminal: no Claim acquires it.
//   - Release undoes a claim of token's while its lease is live: a first
//     attempt's record is removed; a later attempt's is FAILED again with
//     one attempt fewer, its creation time and fingerprint kept, no token
//     (so no earlier owner's resent Fail matches it), and an expiry of the
//     claim's TTL from the release. Anything else (a lapsed lease, another
//     owner, a COMPLETED, FAILED or absent key, a resent Release) is left
//     as it is, and Release returns nil.
//   - A COMPLETED record is kept for the Complete's TTL, a FAILED one for the
//     Fail's, from the transition.
//   - A lease or TTL longer than idempotency.MaxTTL (100 years) holds the
//     key for MaxTTL (idempotency.ClampTTL), and deadlines saturate: a
//     "forever" of time.Duration(math.MaxInt64) never overflows into a
//     deadline in the past.
//   - There is no foreign encoding anyone could write into the store, so
//     idempotency.ErrCorruptRecord never occurs (storetest's corrupt-record
//     case does not apply).
//   - Errors name the operation and the key.
//
// # Clock
//
// Time is measured on the monotonic clock: New reads the clock once, and
// every deadline and expiry is an interval from that reading, taken with
// time.Since, whose result a step of the wall clock (an operator, NTP, a VM
// resumed) does not change. A wall clock stepped forward therefore expires
// no lease early, and one stepped back keeps none alive longer. The times
// reported in a Record are the wall time at New plus that interval: plain
// wall times (without a monotonic reading), which after a step differ from
// time.Now by the step.
//
// Config.Now injects another clock, and tests use it to move through leases
// and TTLs without sleeping. Its readings are subtracted with time.Time.Sub,
// so readings that carry a monotonic reading are measured by it, and others
// (time.Unix, time.Date, a fake clock) by their wall times. A store created
// inside a testing/synctest bubble with the default clock follows the
// bubble's fake clock.
//
// No test here steps the wall clock, and none can: stepping it needs
// privileges and moves the clock of every process on the host (Linux time
// namespaces offset the monotonic clocks, never the real-time one), and Go
// offers no way to make a time.Time whose wall and monotonic readings
// disagree short of rewriting its private fields. What is tested is the
// default clock driving every lease and TTL of the conformance suite with
// real sleeps, and a synctest bubble driving it without; the claim that a
// step moves nothing rests on time.Since's documented use of the monotonic
// reading.
//
// # Memory
//
// Memory stays bounded under a stream of unique keys: every write also
// reclaims the records whose expiry has passed, and reads drop an expired
// record they meet; a record is reclaimed at the first write at or after
// its expiry. No goroutine is started.
//
// A record costs about 200 bytes besides its key, its result and its
// fingerprint: a fixed-size slot (times, attempts, state and the owner
// token, when it is at most 32 bytes long as idempotency.NewToken's are),
// an entry in an index from a hash of the key to the slot, and an item in
// an expiry queue per transition until that item's time. The slots of
// reclaimed records are reused, but like a Go map the store never returns
// the memory of its peak number of records. The layout is chosen for the
// garbage collector, whose work grows with the pointers a heap holds: a
// record holds two (its key, and one allocation with the result, the
// fingerprint and a longer token, nil when all are empty), and the index
// and the expiry queues hold none, so a store of millions of COMPLETED keys
// adds little to every collection. Keys whose hashes collide are told
// apart by comparing the keys.
package memstore
