// Package redisstore is the Redis implementation of [idempotency.Store],
// for any number of processes sharing one Redis: standalone, Sentinel or
// Cluster. It needs Redis 7.0 or newer.
//
//	store, err := redisstore.New(client, nil) // any [redis.UniversalClient]
//
// [NewFromURL] builds the client from a redis:// URL.
//
// # Records and scripts
//
// Each record is one Redis string under its own key, in one of three
// layouts: N (a fresh claim), IN_PROGRESS or FAILED, and COMPLETED.
// codec.lua lays them out byte by byte; every script holds it, and
// codec.go is its Go half. A COMPLETED 48-byte key without output or
// fingerprint takes 136 bytes of Redis memory (MEMORY USAGE).
//
// Each operation is one atomic command: one Lua script by EVALSHA
// (claim.lua, renew.lua, complete.lua, fail.lua, release.lua, get.lua,
// deleteif.lua), or the plain claim below. A script touches only its
// record's key, so the store is Cluster-safe without hash tags. Keys and
// values travel as KEYS and ARGV, never as script text. After NOSCRIPT a
// script is loaded once and the call sent again.
//
// # The cost of a message
//
// A fresh message costs two commands, a claim and a completion. A
// duplicate costs one. Claim and Complete each have a common case beside
// the full script. Renew, Fail, Release, Get and DeleteIf are their
// scripts alone; Delete is one UNLINK.
//   - The common claim is one plain SET key <N record> NX PX lease+TTL GET.
//     It acquires an absent key. A COMPLETED value comes back unchanged,
//     and Go decodes it as codec.lua would: a duplicate. Any other reply
//     wrote nothing, and claim.lua decides.
//   - The common completion is completefast.lua, at the head of the
//     complete script: GET, TIME and SET of the caller's live lease, before
//     the codec is defined. Anything else goes on to complete.lua.
//
// Both earn their place. In one run of idembench -sections floor (Redis
// 7.0, 2 shared vCPUs, 64 connections), Redis spent per message:
//   - a duplicate: 1.0 µs of CPU on the plain claim, 7.6 µs on claim.lua;
//     the duplicate's rate was 0.80 of a GET's, against 0.13;
//   - a fresh message: 8.3 µs with completefast.lua, 10.6 µs without it,
//     and 16.8 µs with neither the plain claim nor completefast.lua.
//
// The SET cannot read the server's clock, and needs not: its PX counts the
// lease on the server. The N record's times are its key's expiry less the
// TTL and the lease, and its next transition writes them out. An acquired
// plain claim reports CreatedAt, UpdatedAt and LeaseExpiresAt from this
// host's clock at the send. Get and every later transition read the
// server's. An owner counts its lease on its own monotonic clock.
//
// # Guarantees
//
// Expiry is Redis's own, and every time a record holds is the server's. A
// claim sets the key to expire its TTL after the lease deadline; Renew
// moves both. A lapsed lease leaves the record: it reads as FAILED with
// its attempts kept, so a crash loop reaches MaxAttempts. The lapsed owner
// is fenced with [idempotency.ErrLeaseLost]. The completing owner's Renew
// gets [idempotency.ErrCompletedByOwner]. Durations round up to whole
// milliseconds.
//
// Release undoes a claim whose owner never learned its outcome, while its
// lease is live. A first attempt's key is deleted. A later attempt goes
// back to FAILED, one attempt fewer, without owner or lease. Anything
// else is left as it is, and Release returns nil.
//
// Every transition is safe to resend, as go-redis does after a broken
// connection. A resent Claim of the holding token acquires again without
// an attempt. A resent Complete finds its token's hash in the COMPLETED
// record. A resent Fail finds its token in the FAILED record. None of them
// changes the record twice.
//
// Decoding is strict. A value that is not a record of this store (another
// type, a string without a tag, of the wrong length, text, JSON) makes the
// script answer "IDEMPOTENCY_CORRUPT <reason>" and write nothing. Claim,
// Renew, Complete, Fail, Release and Get return it as
// [idempotency.ErrCorruptRecord]: never a duplicate, never overwritten.
// Delete removes it. Redis counts it in errorstat_IDEMPOTENCY_CORRUPT.
//
// Client errors are wrapped with the operation and key; [redis.Nil] is
// never returned. A full Redis's refusal says so.
//
// # Deadlines
//
// Every call is bounded by its context's deadline, so a Renew never
// outlives its lease. go-redis does that only with ContextTimeoutEnabled:
// [New] returns [ErrContextTimeoutDisabled] for a go-redis client without
// it. A call cut short matches [context.DeadlineExceeded]; its script may
// still run on the server, and a claim cut short is what Release is for.
//
// # What the Redis must provide
//
//   - Redis 7.0 or newer (SET with NX and GET, PEXPIRETIME). On an older
//     server every claim fails with an error that says so.
//   - maxmemory-policy noeviction, the default. An eviction policy may drop
//     a live record, and its effect runs again. A full Redis still answers
//     duplicates and held keys; it refuses new claims and completions.
//   - Persistence (appendonly yes), if a restart must not forget completed
//     keys.
//   - Replication is asynchronous: a failover may lose the last
//     transitions. [Options].Replicas closes that window.
//   - A clock that does not jump: a clock stepped forward ends leases early.
//
// # Replica acknowledgement
//
// With [Options].Replicas set to N, a Claim, Renew or Complete that wrote
// waits for WAIT N on its own connection. While the replicas keep up, the
// command and WAIT share one pipeline: one round trip. A failover to a
// replica that acknowledged keeps the transition. A call that wrote
// nothing never waits once a primary's replicas fall behind. A Cluster's
// MOVED or ASK is followed at once. A ring is refused.
//
// When fewer replicas acknowledge in time, the call still succeeds: the
// primary applied it. The shortfall goes to [Options].OnReplicaShortfall;
// alert on it. Fail and Release never wait: losing one in a failover
// leaves a lease that lapses, the same failed attempt.
//
// # Auto-pipelining
//
// On a *redis.Client, the store hands its calls to go-redis's deferred
// auto-pipeliner ([redis.Client.AsyncAutoPipeline]), with 8 batches on the
// wire, unordered. Calls that meet a busy pipeliner go out together; each
// is still its own command, and keeps its own deadline. Cluster clients
// and rings send each call on its own. So do calls under Replicas, a
// client without ReadTimeout, and a client whose pipeliner is ordered.
// [Options].DisableAutoPipelining turns it off.
//
// docs/GUARANTEES.md (The Redis store, case by case) has the long cases:
// deadlines in a batch, NOSCRIPT, stalled connections and handshakes,
// replica waits, a full Redis, and the tests that inject each fault.
//
// # Watermill's Deduplicator
//
// [NewExpiringKeyRepository] gives Watermill's [middleware.Deduplicator] a
// repository shared by every consumer: one SET NX GET PX per message.
package redisstore
