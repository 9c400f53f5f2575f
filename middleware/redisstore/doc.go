// Package redisstore is the Redis implementation of middleware.Store, for any
// number of processes sharing one Redis (standalone, Sentinel or Cluster).
//
// Each key is one Redis key. While IN_PROGRESS or FAILED it is a HASH with
// short fields (state, owner token, attempts, fingerprint, created and
// updated times in the server's milliseconds); once COMPLETED — most of the
// keys a busy service holds — it is a packed string (attempts, times,
// fingerprint, result), about 136 bytes of Redis memory for a 48-byte key
// without output. Every transition, and Get, is one Lua script run by EVALSHA — one round
// trip, atomic on the server; a server that does not know the script yet
// answers NOSCRIPT and the script is sent once with EVAL, which loads it.
// Keys and values travel only as KEYS and ARGV, never spliced into script
// text, so any bytes are safe in them. A script touches only the record's own
// key, which makes the store Cluster-safe with no hash-tag rules for callers.
//
// Expiry is Redis's own: PEXPIRE with the lease while IN_PROGRESS, with the
// TTL once COMPLETED or FAILED. A lease that expires deletes the record, so a
// crashed owner's key becomes ABSENT and is claimable again (its attempt
// count restarts). Durations are rounded up to whole milliseconds.
//
// Errors of the client (a Redis that is down, a timeout, a cancelled context)
// are returned wrapped with the operation and key; redis.Nil is never
// returned. A stale owner gets middleware.ErrLeaseLost.
//
// # What the Redis must provide
//
//   - Redis 5 or newer: the scripts read the server's clock (TIME) before they
//     write, which needs script effects replication, the default since 5.0.
//   - maxmemory-policy noeviction (the default). Every record has a TTL, so
//     any volatile-* or allkeys-* policy may evict an IN_PROGRESS or
//     COMPLETED record under memory pressure, and the effect runs again. Size
//     the memory for CompletedTTL × the rate of new keys instead.
//   - Persistence, if a restart must not forget completed keys: a Redis that
//     restarts empty lets every later copy of a completed message run again
//     (appendonly yes; appendfsync everysec loses at most a second).
//   - Replication is asynchronous: a failover to a replica may lose the last
//     claims and completions, with the same effect as a restart. WAIT is not
//     used; the store trades that window for one round trip per transition.
//
// ExpiringKeyRepository adapts a Redis client to Watermill's
// middleware.ExpiringKeyRepository, so users of Watermill's own Deduplicator
// get a repository shared by every consumer.
package redisstore
