// Package memstore is an in-memory [idempotency.Store] for tests, demos and
// one process: a map, a mutex and expiry on read. Its records live in one
// process; a restart loses them. It is never a default for production.
//
// It passes [storetest.Run]:
//
//   - Each call is atomic under one mutex: of concurrent claims, one acquires.
//   - A lapsed lease reads as FAILED; its owner gets [idempotency.ErrLeaseLost].
//   - A call resent after a lost reply is answered as the first was.
//   - A lease or TTL over [idempotency.MaxTTL] holds the key for MaxTTL.
//   - [idempotency.ErrCorruptRecord] never occurs.
//
// The now argument of [New] is the clock; nil means [time.Now]. A fake clock
// passes leases and TTLs without sleeping.
//
// No goroutine is started. A read drops the expired record it meets; a claim
// sweeps all expired records once as many were added as the last sweep
// left, so the map holds about twice the live records at most.
//
// [storetest.Run]: https://pkg.go.dev/github.com/idempotency/watermill-idempotency/middleware/storetest#Run
package memstore
