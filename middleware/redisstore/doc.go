// Package redisstore is the Redis implementation of idempotency.Store, for any
// number of processes sharing one Redis (standalone, Sentinel or Cluster).
//
// Every transition, and Get, is one Lua script run by EVALSHA, but for the
// common claim, which is one plain SET (see The cost of a message): one
// round trip, atomic on the server; a server that does not know the script yet
// answers NOSCRIPT and the script is loaded once (EVAL on a call sent on its
// own, SCRIPT LOAD for auto-pipelined calls) and the call sent again.
// Keys and values travel only as KEYS and ARGV, never spliced into script
// text, so any bytes are safe in them. A script touches only the record's own
// key, which makes the store Cluster-safe with no hash-tag rules for callers.
// The scripts are the .lua files of this package; prelude.lua, which each of
// them starts with, documents the encoding byte by byte.
//
// # Records
//
// Each key is one Redis key holding a packed string. While IN_PROGRESS or
// FAILED: a tag byte (0xC0), the state, attempts, created and updated
// times, the lease deadline and the claim's TTL (in the server's
// milliseconds), the owner's token and the fingerprint. A fresh claim
// writes the same layout in state N, without times and with the lease's
// length where the deadline goes: its times come from the key's expiry
// (PEXPIRETIME), which the server set, and its next transition writes them
// out. So an operator who changes such a key's expiry changes its lease: an
// N record without an expiry (PERSIST), or whose expiry was moved later so
// far that it would have been created more than a minute after the
// server's clock (an allowance for a clock stepped back), is corrupt rather
// than claimed for as long as the new expiry says; one moved earlier ends
// its lease early. Once COMPLETED —
// most of the keys a busy service holds — a shorter one: a tag byte (0xC1),
// attempts, created and updated times, the first 8 bytes of the SHA-1 of the
// token that completed it, the fingerprint and the result. Neither tag byte
// occurs in UTF-8 text. A COMPLETED 48-byte key without output or
// fingerprint takes 136 bytes of Redis memory (MEMORY USAGE, jemalloc).
//
// # The cost of a message
//
// A fresh message costs two calls, a claim and a completion, and a
// duplicate one call:
//   - Claim is one plain command, no script: SET key <N record> NX PX
//     lease+TTL GET. An absent key is claimed by that one write (acquired);
//     a COMPLETED record comes back as it is, nothing written, and the store
//     decodes and checks it in Go with the checks of the codec (a
//     duplicate). Redis runs it at the cost of a plain SET, a third of a
//     script's. Any other reply (a key held, FAILED or lapsed, the caller's
//     own claim resent, a corrupt value without the COMPLETED tag, a full
//     Redis's OOM refusal) has written nothing, and the claim goes on to claim.lua: a second round trip, for
//     keys that are not the common case. A value with the COMPLETED tag
//     that fails those checks is idempotency.ErrCorruptRecord at once.
//   - Complete and Renew settle their common case in a fast section at the
//     head of their script, before the codec (completefast.lua,
//     renewfast.lua): GET, TIME (and PEXPIRETIME for an N record) and SET
//     when the key is an IN_PROGRESS string of the caller's token whose
//     every field checks out. Every other case goes on to the full
//     transition, nothing written yet.
//
// claim.lua starts with a fast section too (claimfast.lua): TIME and SET NX
// GET. The owner hash of a COMPLETED string is computed by the store, not
// by a script.
//
// The plain claim cannot read the server's clock, and does not need to: the
// lease is the PX that Redis counts from when it runs the SET, and the
// record's times are the key's expiry less the TTL and the lease. What it
// cannot do is report them: an acquired plain claim reports CreatedAt,
// UpdatedAt and LeaseExpiresAt from this host's clock when it sent the
// SET, to the millisecond, which is behind the server's by the time the
// command took to arrive plus any skew between the two clocks. Get, and
// every later transition, read the server's. The owner's renewals and
// deadlines are counted on its own monotonic clock from before the send,
// so they never rely on those reported times (see idempotency.Lease).
//
// # Guarantees
//
// Expiry is Redis's own, and every time a record holds is the server's
// (TIME, or an expiry the server set), never a client's clock; only the
// times an acquired plain claim reports are the client's (see above). A
// claim sets the key to expire its TTL after the lease
// deadline; Renew moves both. A lease that lapses (its owner stopped
// renewing and never completed nor failed) leaves the record in place: it
// reads as FAILED, with LeaseExpiresAt the lapsed deadline and its attempts
// kept, so the next Claim counts one more attempt and a message that kills
// its consumer every time reaches MaxAttempts. The lapsed owner is fenced:
// Renew, Complete and Fail answer idempotency.ErrLeaseLost. The completing
// owner's Renew of its COMPLETED record answers
// idempotency.ErrCompletedByOwner instead (renew.lua replies 2). COMPLETED
// and FAILED records expire the TTL given to Complete and Fail. Durations are
// rounded up to whole milliseconds.
//
// Release undoes a claim whose owner never learned its outcome, if the
// token still holds a live lease: a first attempt's key is deleted; a later
// attempt's record goes back to FAILED with one attempt fewer, without an
// owner (so no earlier owner's resent Fail or Complete matches it) and
// without a lease, its created time and fingerprint kept, and the key
// expires the claim's TTL after the release. A lapsed lease, another token's
// key, a FAILED, COMPLETED or absent key are left as they are, and Release
// returns nil.
//
// Every transition is safe to resend, as go-redis does after a broken
// connection (MaxRetries): a Claim resent with the token that holds the key
// acquires it again without counting an attempt; a Complete resent by the
// owner whose Complete was applied finds its token's hash in the record and
// succeeds; a Fail resent by its owner, before anyone claimed the key again,
// finds its token in the FAILED record and succeeds. A resent Renew renews
// again; a resent Release finds nothing of its token's and returns nil. None
// of them changes the record a second time.
//
// Decoding is strict. A value under a key that is not a record of this
// store — another type (a HASH included), a string without a tag, shorter
// than its header or of the wrong length, text, JSON, an IN_PROGRESS record
// without its token — makes the script answer the error "IDEMPOTENCY_CORRUPT <reason>" (counted
// by Redis as errorstat_IDEMPOTENCY_CORRUPT) without writing anything; a
// COMPLETED string that a claim's fast section returns is checked by the
// store with the same checks and reasons. The store returns it as
// idempotency.ErrCorruptRecord, wrapped with the operation and key, from
// Claim, Renew, Complete, Fail, Release and Get: it is never read as a
// duplicate, never overwritten, never given an expiry. Delete removes it.
// The fast sections read a key of another type with a command that Redis
// refuses (WRONGTYPE, which Redis counts in errorstat_WRONGTYPE) before the
// codec reads it. go-redis does not retry an error reply, nor does it drop
// the connection over one.
//
// Errors of the client (a Redis that is down, a timeout, a cancelled context)
// are returned wrapped with the operation and key; redis.Nil is never
// returned. A stale owner gets idempotency.ErrLeaseLost.
//
// # Deadlines
//
// Every call is bounded by its context's deadline, so a call made under an
// owner's lease (a Renew above all) never outlives it. go-redis only does
// that with ContextTimeoutEnabled set in the client's options; without it,
// socket I/O runs under context.Background() and waits for ReadTimeout
// whatever the context says. New therefore returns
// ErrContextTimeoutDisabled for a *redis.Client (Sentinel failover clients
// included), *redis.ClusterClient or *redis.Ring without it; another
// UniversalClient implementation is taken as it is. NewFromURL builds the
// client from a redis:// URL with ContextTimeoutEnabled set. A call cut short by its
// deadline returns an error matching context.DeadlineExceeded (go-redis
// reports it as the socket's "i/o timeout", which the store adds the
// context's error to); the script may still run on the server afterwards,
// and a claim cut short is what Release is for. NewExpiringKeyRepository
// takes any client: it holds no lease.
//
// # What the Redis must provide
//
//   - Redis 7.0 or newer: the claim is SET with both NX and GET, and a fresh
//     claim's times are read back with PEXPIRETIME. On an older server every
//     claim fails with an error that says so. The tests run on Redis 7.0.
//   - maxmemory-policy noeviction (the default). Every record has a TTL, so
//     any volatile-* or allkeys-* policy may evict an IN_PROGRESS or
//     COMPLETED record under memory pressure, and the effect runs again. Size
//     the memory for CompletedTTL × the rate of new keys instead. A full
//     Redis (used memory above maxmemory) refuses every write, even a SET
//     NX GET of a key that exists: a duplicate of a COMPLETED key, and a
//     claim of a key another owner holds, are still answered (claim.lua
//     reads the key, one more round trip), and so is ExpiringKeyRepository's
//     duplicate; a fresh claim, Renew, Complete and Fail return an error
//     that says the Redis is full, nothing written; Get and Delete work
//     (TestFullRedisAnswersDuplicates). An owner whose Complete is refused
//     leaves its key IN_PROGRESS, and its message runs again once the lease
//     lapses: alert on used memory well below maxmemory.
//   - Persistence, if a restart must not forget completed keys: a Redis that
//     restarts empty lets every later copy of a completed message run again
//     (appendonly yes; appendfsync everysec loses at most a second).
//   - Replication is asynchronous: by default a failover to a replica may
//     lose the last claims and completions, with the same effect as a
//     restart (a lost COMPLETED lets the next copy of its message run
//     again). Options.Replicas closes that window; see Replica
//     acknowledgement below.
//   - A clock that does not jump: a lease deadline is the primary's TIME plus
//     the lease, so a clock stepped forward (or a failover to a replica whose
//     clock is ahead) ends leases early. A clock stepped back never makes a
//     record's updated time precede its created time.
//
// # Replica acknowledgement
//
// NewWithOptions with Options.Replicas set to N makes Claim, Renew and
// Complete wait until N replicas have the transition: each is sent to the
// primary of its key, never auto-pipelined (see Auto-pipelining), with
// WAIT N on the same connection. While that primary's replicas keep up,
// the command (EVALSHA, or the plain claim's SET) and WAIT go in one
// pipeline, so it is still one round trip (and, when the server answers
// NOSCRIPT, a second one with EVAL, once per script and server). A Sentinel
// failover (or a Cluster failover) to a replica that acknowledged keeps
// what the owner was told: its claim, its renewed lease and its COMPLETED
// record. The cost is the replicas' round trip on each of those calls.
//
// Only a transition that wrote is counted: a duplicate of a COMPLETED key,
// a claim of a key another owner holds and a Renew or Complete of a lease
// lost change nothing, so they are never a shortfall. Once a WAIT on a
// primary falls short, its calls send WAIT after the command, on the same
// connection, and only if it wrote, until a WAIT there is acknowledged
// again: while fewer than N replicas are in reach, a call that wrote
// nothing does not wait, and one that wrote takes a second round trip
// besides the wait. The calls already on their way when the replicas fell
// behind still have WAIT in their pipelines: each waits out its timeout
// once, not counted if it wrote nothing (TestReplicaShortfallOnlyForWrites,
// TestPlainClaimReplicaHeldKeyWritesNothing).
//
// WAIT is asked to wait at most Options.ReplicaTimeout (500 ms by default),
// and at most half of what is left before the call's deadline. Redis ends a
// WAIT that times out on its next server tick, not at once: up to 100 ms
// later at its default hz of 10 (measured on 7.0.15: WAIT 1 5 took 37 ms,
// WAIT 1 100 took 193 ms). A call whose deadline is only a few hundred
// milliseconds away when replicas are out of reach can therefore end with
// context.DeadlineExceeded instead of a counted shortfall: keep StoreTimeout
// and the lease well above ReplicaTimeout plus that tick. When fewer than N
// replicas acknowledge in time, the transition was still applied on the
// primary, so the call succeeds: a Complete after a run whose effect
// happened returns nil and the message is acked. The shortfall is an
// outcome of its own: it is counted (ReplicaStats().Shortfalls), logged at
// Info level with the operation, key and replica counts, and passed to
// Options.OnReplicaShortfall. Only a failover before the replicas catch up
// loses such a transition; alert on the counter. Fail and Release do not
// wait: losing one in a failover leaves a lease that lapses, which counts
// as the same failed attempt.
//
// WAIT is sent on the connection that ran the command: with a cluster
// client, to the primary of the key's slot as the client last saw it. A
// MOVED or ASK answer there is followed at once, as the client follows it
// for any other command: the store reloads the client's slot map (with
// ForEachShard, which reloads it first) and sends the command and its WAIT
// again to the node the answer names, after ASKING for ASK, up to the
// client's MaxRedirects (TestReplicaAckFollowsSlotMoves). An ASK to a
// master that holds no slot yet is not in that map, and is returned as an
// error until the slot has moved. A *redis.Ring is refused
// (ErrReplicaAckUnsupported): its shards have no replicas. ReplicaTimeout
// must be shorter than the client's ReadTimeout, which bounds a pipeline's
// reply.
//
// What each deployment keeps, as TestSentinelFailover measures it (a master
// killed under a steady stream while its replica lags 30 ms behind, then
// every key redelivered): without replica acknowledgement, the completions
// of the last moments before the crash are lost and their effects run again
// on redelivery; with Replicas 1, no acknowledged completion is lost and no
// acknowledged key's effect runs again. A standalone Redis without
// persistence forgets everything on a restart; with appendfsync always it
// forgets nothing it acknowledged.
//
// # Auto-pipelining
//
// On a client of one primary (a *redis.Client: standalone, or a Sentinel
// failover client), unless Options.DisableAutoPipelining is set, the store
// hands its scripts to go-redis's own automatic pipelining: the client's
// deferred auto-pipeliner (Client.AsyncAutoPipeline). go-redis marks that
// API experimental; the store is tested with v9.23.0. A call that finds the
// pipeliner idle is flushed at once, on its own (go-redis does not wait for
// a batch to fill); calls that arrive while batches are on the wire go out
// together. Each call is still its own command, so a fresh message costs
// two commands and a duplicate one; what batching saves is round trips, the
// client's and the server's system calls per command, which bound a loaded
// store on a small machine.
//
// If the client has no deferred auto-pipeliner yet, New creates it, with
// MaxConcurrentBatches 8 and Unordered set (go-redis keeps the first
// configuration of a client's auto-pipeliner, so an application that calls
// AsyncAutoPipeline on the same client later gets this one). If the
// application created it before, with a single batch on the wire (go-redis's
// default, ordered), the store sends every call on its own instead, as with
// DisableAutoPipelining: see stalls below. So does a client without a
// ReadTimeout or WriteTimeout (-1 in its options): a batch is bounded by
// those alone, not by its calls' deadlines, so a batch on a connection that
// stalls would hold its slot for ever, and eight of them would stop the
// store for good (TestAutoPipeliningNoReadTimeout).
//
// A cluster client and a ring are not auto-pipelined; each call goes out on
// its own. go-redis has no auto-pipeliner for a ring. Its cluster
// auto-pipeliner (ClusterClient.AsyncAutoPipeline) shards its queue by slot
// range, not by primary, and a batch's calls complete together once every
// primary it went to has answered: calls to a healthy primary then wait for
// a paused one batched beside them. TestClusterPausedPrimaryDelaysNoOtherPrimary
// shows it: with one of three primaries paused for a second (DEBUG SLEEP),
// 4 of 10998 claims with 300 ms to live on the other two failed through it,
// none without it.
//
// What each call keeps, whatever the calls batched beside it do (each
// guarantee is a test on a real Redis through a fault proxy):
//
//   - Its deadline. A batch runs on go-redis's own context, bounded by the
//     client's ReadTimeout, never by one of its calls' deadlines; each caller
//     waits for its reply under its own context and returns at its own
//     deadline. A call whose context has ended is not handed over; one that
//     gives up waiting leaves its command to go-redis, which does not
//     withdraw it: the script may still run, as a command already written to
//     a plain client's connection may, and a claim cut short is what Release
//     is for. Batches are unordered, so a Release of a claim given up while
//     go-redis still has it first waits (under the Release's own context)
//     until that claim is answered; it would otherwise reach Redis first, on
//     another connection, undo nothing, and leave the key IN_PROGRESS under
//     a token nobody holds until its lease lapsed
//     (TestAutoPipeliningMixedDeadlines, TestAutoPipeliningCallGivenUpReturns,
//     TestAutoPipeliningDeadlines, TestAutoPipeliningReleaseAfterGivenUpClaim).
//   - Its replica wait. Under Options.Replicas a claim, renewal or completion
//     is not auto-pipelined: go-redis sends WAIT, a blocking command, on a
//     connection of its own, where it would count none of the script's
//     writes. Each of them is sent on its own, its script and a WAIT with
//     its own timeout on one connection (see Replica acknowledgement).
//     Fail, Release and Get are auto-pipelined and never wait for a replica
//     (TestReplicaWaitIsEachCallsOwn, TestFailAndReleaseDoNotWaitForReplicas,
//     TestAutoPipeliningReplicaAck).
//   - One extra round trip after NOSCRIPT (SCRIPT FLUSH, a restart, a failover
//     to a node without the scripts). The calls that meet it wait for one
//     SCRIPT LOAD of their script, sent once for all of them and bounded by
//     the client's ReadTimeout rather than by any one caller's deadline, and
//     go out again by hash, batched
//     (TestAutoPipeliningNoscriptOneExtraRoundTrip). That shared load is the
//     store's one mechanism of its own here: go-redis's auto-pipeliner has no
//     NOSCRIPT recovery, and Script.Run's (EVALSHA, then EVAL) would send
//     each call's whole script text again (9 KB for a claim) and could only
//     be waited for without a deadline on the deferred face.
//   - Progress while connections stall. A batch whose connection stalls (a
//     half-open connection, a retransmission back-off) holds one of the 8
//     batch slots until the client's ReadTimeout, and the calls in it fail at
//     their deadlines; the other slots carry the calls made meanwhile, on
//     other connections (TestAutoPipeliningFlowsPastStalledConnections, with
//     two stalled connections). Eight stalled connections at once stop the
//     store's calls until their ReadTimeout. A connection may also stall in
//     go-redis's handshake, which asks for maintenance notifications (CLIENT
//     MAINT_NOTIFICATIONS) unless the client's MaintNotificationsConfig says
//     ModeDisabled. A server that refuses them (Redis 7.0 does) makes
//     go-redis give them up under a lock of the client's that waits for
//     every handshake in flight: connections opened meanwhile wait for the
//     stalled ones, and so do the calls on them (in the test, the 20 claims
//     batched on one such connection; without auto-pipelining, 1 to 10 of
//     them). NewFromURL's client does not ask for the notifications
//     (TestAutoPipeliningFlowsPastStalledHandshakes); give a client passed
//     to New MaintNotificationsConfig{Mode: maintnotifications.ModeDisabled}
//     too.
//
// Every call is still the same atomic command, so the store's contract
// (storetest) holds with and without auto-pipelining, and so does every
// fault test. go-redis resends a
// batch after a network error (MaxRetries) as it resends a single command;
// every transition is safe to resend (see Guarantees).
//
// ExpiringKeyRepository adapts a Redis client to Watermill's
// middleware.ExpiringKeyRepository, so users of Watermill's own Deduplicator
// get a repository shared by every consumer. Each call marks its key with a
// value of its own (SET NX GET PX), so a call whose reply was lost and that
// the client resent still reports its key as new.
package redisstore
