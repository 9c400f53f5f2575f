// Package redisbackend is the Redis Streams broker of package backends.
// Imported for its side effect, it registers the broker, and backends.New
// then builds a Publisher and Subscriber for redis://[user:pass@]host:6379/0
// (rediss:// for TLS):
//
//	import _ "github.com/idempotency/watermill-idempotency/backends/redisbackend"
//
// It links watermill-redisstream and go-redis, which a program that does
// not import it does without; New refuses a redis:// URL there with
// backends.ErrBrokerNotLinked.
//
// The settings named below (Group, Consumer, NackResendSleep and the Redis
// section) are fields of backends.Config, which holds every broker's
// settings so that one Config, and backends.FromEnv, serves them all.
//
// watermill-redisstream (go-redis). Each topic is a stream; Group is a
// consumer group on it, created at the start of the stream ("0"). The
// publisher and the subscriber each get their own client from the URL: the
// library closes the client it was given when the publisher or subscriber
// closes, and a router closes both.
//
// The consumer name is Config.Consumer, the host name (the pod name) by
// default, where the library picks a random name per process: a restarted
// process then comes back as the same consumer instead of leaving a dead one
// behind.
//
// A nacked message is resent by the subscriber itself after NackResendSleep
// (the library resends at once, in a loop) and holds back the stream for
// this consumer until it is acked. Each nack also refreshes the entry's idle
// time in Redis (XCLAIM to the same consumer, JUSTID), every third of
// MaxIdleTime while it waits out NackResendSleep and again before the
// resend, so a message that keeps failing stays with its consumer, however
// long NackResendSleep is: without that, its idle time grew
// with every attempt, another consumer claimed it after MaxIdleTime and
// looped on it too, and one failing message stalled the whole group. The
// message the failing consumer has read ahead is claimed by another after
// MaxIdleTime (backends.Config.CheckLease checks the lease against it, and against
// NATS.AckWait). A message delivered but not acked for
// Redis.MaxIdleTime (60 s) is claimed (XCLAIM) by another consumer of the
// group, checked every Redis.ClaimInterval (5 s). Redis Streams has no
// heartbeat, so this happens to a live consumer whose handler is slow as
// surely as to a dead one. MaxIdleTime is therefore kept above the
// idempotency lease (40 s): a message claimed from a live consumer finds its
// key IN_PROGRESS, and the middleware's in-progress nack sends it round again
// until the first handler completes, after which it is acked as a duplicate;
// one claimed from a dead consumer finds the lease expired and runs.
//
// Streams grow without bound unless Redis.MaxLen caps them (approximately;
// trimming drops the oldest entries whether or not every group read them).
//
// A stream deleted under a running subscriber (DEL, or a restart without
// persistence) takes its groups with it, and the next XADD creates it
// without them. The subscriber's next read is refused with NOGROUP; it then
// creates the group again (XGROUP CREATE ... MKSTREAM, at "0") and reads on.
// The entries the deleted stream held are gone with it, acked or not, but
// for those the subscriber had read already. Everything written to the new
// stream is delivered, also what came before the group was back: the group
// starts at the stream's beginning. A group destroyed alone is created again
// the same way, and then reads its stream again from the beginning, as a new
// group does; the idempotency middleware acks what it completed within
// CompletedTTL as duplicates.
package redisbackend
