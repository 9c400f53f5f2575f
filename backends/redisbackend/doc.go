// Package redisbackend is the Redis Streams broker of package backends.
// Imported for its side effect, it registers redis://[user:pass@]host:6379/0
// and rediss:// for TLS:
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
//
// It links watermill-redisstream and go-redis. A program that does not
// import it links neither.
//
// # Parameters
//
//	redis://localhost:6379/0?max_idle_time=90s&claim_interval=5s&maxlen=100000
//
// max_idle_time (60 s) is how long a message may stay unacked before
// another consumer claims it (XCLAIM). claim_interval (5 s) is how often a
// subscriber looks. maxlen (none) caps each stream, approximately; trimming
// drops the oldest entries whether or not every group read them. go-redis
// URL options pass through; backends.Config.Tune receives each
// *redis.Options.
//
// # What it sets
//
// Each topic is a stream, and backends.Config.Group a consumer group on it,
// created at "0": nothing written before is skipped. The publisher and
// every subscriber have a client of their own; the library closes it.
//
// The consumer name is backends.Config.Consumer, the host name by default.
// The client name is the same, with '_' for what Redis refuses in one.
// The library picks a random name per process, which leaves a dead
// consumer behind at every restart.
//
// # Failures
//
// Redis Streams has no heartbeat. A live consumer whose handler runs longer
// than max_idle_time loses the message as surely as a dead one. So
// max_idle_time stays above the idempotency lease (40 s). A message claimed
// from a live consumer finds its key IN_PROGRESS and waits; one claimed
// from a dead consumer finds the lease expired and runs.
// backends.Config.CheckLease checks the lease against it.
//
// A nacked message is resent by the subscriber after NackResendSleep; the
// library resends at once, in a loop. It holds back the stream for this
// consumer. Each nack refreshes the entry's idle time (XCLAIM JUSTID), and
// so does every third of max_idle_time while it waits. A failing message
// therefore stays with its consumer instead of stalling the whole group.
//
// An entry that does not decode reaches the handler. Without a UUID it
// comes with an empty one; with unreadable metadata, with
// backends.MetadataUndecodable. The library stopped reading the stream.
//
// A stream or group deleted under a running subscriber comes back. The
// next read is refused with NOGROUP, and the subscriber creates the group
// again at "0". docs/GUARANTEES.md ("Brokers") has what is delivered then.
package redisbackend
