// Package redisstore is the Redis implementation of middleware.Store, for any
// number of processes sharing one Redis (standalone, Sentinel or Cluster).
//
// Each key is one Redis HASH with short fields (state, owner token, attempts,
// fingerprint, result, created and updated times in the server's
// milliseconds). Every transition is one Lua script run by EVALSHA — one round
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
// ExpiringKeyRepository adapts a Redis client to Watermill's
// middleware.ExpiringKeyRepository, so users of Watermill's own Deduplicator
// get a repository shared by every consumer.
package redisstore
