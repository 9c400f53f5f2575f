// Package redisstore is the Redis implementation of [idempotency.Store],
// for any number of processes sharing one Redis: standalone, Sentinel or
// Cluster. It needs Redis 7.0 or newer.
//
//	store, err := redisstore.New(client, nil) // any [redis.UniversalClient]
//
// [NewFromURL] builds the client from a redis:// URL. docs/GUARANTEES.md
// (The Redis store, case by case) has the long cases and their tests.
//
// # Records and scripts
//
// Each record is one string under its key, laid out by codec.lua: N (a
// fresh claim), IN_PROGRESS or FAILED, or COMPLETED. A COMPLETED 48-byte
// key takes 136 bytes. Each operation is one atomic command on its key
// alone (Cluster-safe): a Lua script by EVALSHA, or the plain claim. A
// fresh message costs two commands, a duplicate one.
//
// Claim and Complete have a common case beside the full script:
//   - Claim sends SET key <N record> NX PX lease+TTL GET. It acquires an
//     absent key; a COMPLETED reply is a duplicate. Anything else wrote
//     nothing, and claim.lua decides.
//   - Complete starts with completefast.lua: GET, TIME and SET of the
//     caller's live lease. Anything else goes on to complete.lua.
//
// In one run of idembench -sections floor (Redis 7.0, 2 shared vCPUs, 64
// connections), Redis spent per message:
//   - a duplicate: 1.0 µs of CPU on the plain claim, 7.6 µs on claim.lua;
//     its rate was 0.80 of a GET's, against 0.13;
//   - a fresh message: 8.3 µs with completefast.lua, 10.6 µs without it,
//     and 16.8 µs with neither.
//
// # Guarantees
//
// Expiry is Redis's own, and every stored time is the server's. A claim's
// key expires its TTL after the lease deadline; Renew moves both. A lapsed
// lease reads as FAILED with its attempts kept. The lapsed owner gets
// [idempotency.ErrLeaseLost]; the completing owner's Renew gets
// [idempotency.ErrCompletedByOwner]. Durations round up to milliseconds.
// Release undoes a live claim. Every transition is safe to resend.
//
// A value that is no record of this store is [idempotency.ErrCorruptRecord]:
// never a duplicate, never overwritten. [redis.Nil] is never returned.
//
// Every call is bounded by its context's deadline ([New] refuses a client
// without ContextTimeoutEnabled). A call cut short matches
// [context.DeadlineExceeded]; its command may still run.
//
// # What the Redis must provide
//
//   - Redis 7.0 or newer; an older server fails every claim, saying so.
//   - maxmemory-policy noeviction, the default: eviction may drop a live
//     record. A full Redis still answers duplicates and held keys.
//   - appendonly yes, if a restart must not forget completed keys.
//   - A clock that does not jump forward, which ends leases early.
//
// Replication is asynchronous: a failover may lose the last transitions.
// With [Options].Replicas, a write of Claim, Renew or Complete waits for
// WAIT; a shortfall goes to [Options].OnReplicaShortfall.
//
// On a *redis.Client with a ReadTimeout, calls go through go-redis's
// auto-pipeliner ([redis.Client.AsyncAutoPipeline]), 8 batches on the wire,
// each call with its own deadline, unless [Options].DisableAutoPipelining.
//
// [NewExpiringKeyRepository] gives Watermill's [middleware.Deduplicator] a
// repository shared by every consumer: one SET NX GET PX per message.
package redisstore
