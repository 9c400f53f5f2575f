// Package memstore is an in-memory [idempotency.Store] for tests, demos and
// one process. It is a map, a mutex and expiry on read.
//
// It is never a silent default for production. Its records live in one
// process's memory. Two consumers do not see each other's keys. A restart
// loses every COMPLETED record.
//
// # Guarantees
//
// It has the state machine of every store, and passes [storetest.Run]:
//
//   - Each call is atomic under one mutex. Of any number of concurrent
//     claims of a key, exactly one acquires it.
//   - A lease whose deadline has passed reads as FAILED. Its owner gets
//     [idempotency.ErrLeaseLost], and the next claim is a new attempt.
//   - A call resent after a lost reply is answered as the first was: the
//     owner's Claim acquires again; its Complete, Fail or Release is nil.
//   - A COMPLETED record is kept for the Complete's TTL, a FAILED one for
//     the Fail's, an IN_PROGRESS one for the claim's TTL after its lease.
//   - A lease or TTL over [idempotency.MaxTTL] holds the key for MaxTTL.
//   - [idempotency.ErrCorruptRecord] never occurs: nothing foreign can be
//     written into the map.
//
// # Clock
//
// The now argument of [New] is the clock; nil means [time.Now]. Its readings carry
// the monotonic clock, so a step of the wall clock moves no deadline.
// Tests inject a fake clock to pass leases and TTLs without sleeping.
//
// # Memory
//
// No goroutine is started, and there is nothing to close. A read drops the
// expired record it meets. A claim that adds a record sweeps out all
// expired ones, once as many were added as the last sweep left. So a claim
// costs a constant on average, and the map holds at most about twice the
// records live at the last sweep.
//
// [storetest.Run]: https://pkg.go.dev/github.com/idempotency/watermill-idempotency/middleware/storetest#Run
package memstore
