// Package redisbackend is the Redis Streams broker of package backends.
// Imported for its side effect, it registers redis://[user:pass@]host:6379/0
// and rediss:// for TLS. It links watermill-redisstream and go-redis.
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
//
// # Parameters
//
//	redis://localhost:6379/0?max_idle_time=90s&claim_interval=5s&maxlen=100000
//
// Package backends lists the parameters. maxlen trims the oldest entries
// whether or not every group read them. go-redis URL options pass through;
// backends.Config.Tune receives each *redis.Options.
//
// # What it sets
//
// Each topic is a stream, and backends.Config.Group a consumer group on it,
// created at "0": nothing written before is skipped. The publisher and each
// subscriber have their own client. The consumer name is
// backends.Config.Consumer (the host name), stable across restarts; the
// client name is the same, with '_' for what Redis refuses in one.
//
// # Failures
//
// Redis Streams has no heartbeat: a handler running longer than
// max_idle_time loses its message as a dead one does. So max_idle_time
// stays above the idempotency lease (40 s; backends.Config.CheckLease). A
// message claimed from a live consumer finds its key IN_PROGRESS and
// waits; one from a dead consumer finds the lease expired and runs.
//
// A nacked message is resent after NackResendSleep, holding back the stream
// for this consumer. Its idle time is refreshed (XCLAIM JUSTID) at the nack
// and every third of max_idle_time: it stays with its consumer instead of
// stalling the whole group.
//
// An entry that does not decode reaches the handler: without a UUID, with
// an empty one; with unreadable metadata, with backends.MetadataUndecodable.
// A stream or group deleted under a running subscriber comes back: on
// NOGROUP it creates the group again at "0". docs/GUARANTEES.md ("Brokers")
// has what is delivered then.
package redisbackend
