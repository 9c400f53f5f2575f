// Command idembench measures what the idempotency middleware costs per
// message beside the least a deduplication on Redis can cost, and ends with
// the table of the project's performance targets, each met or missed.
//
// Sections (-sections, all by default):
//
//   - floor: on a private redis-server, the commands our store sends per
//     message against SET NX PX then SET XX PX (a fresh message) and GET (a
//     duplicate). Ours are captured, not written down: a go-redis hook
//     watches a redisstore claim, complete and claim again a template key,
//     and those commands are sent again with only the key changed. 64
//     connections send pipelines of 16 commands; -floor-rounds rounds of
//     -floor-d per side, alternating which side goes first. The ratio is the
//     median of the rounds' ratios; Redis CPU is its main thread's (INFO
//     cpu). Fresh keys must end COMPLETED, duplicates keep their attempts.
//   - stats: on a private redis-server, the store's commands and round trips
//     per message (a go-redis hook) for fresh messages, duplicates with the
//     local cache off, and duplicates the cache holds, at each -c; the
//     MEMORY USAGE of a COMPLETED key; and with -pg, pgstore's statements
//     per message (a pgx tracer): fresh, duplicate (cache off), and fresh
//     with the completion in the handler's transaction (those outside it).
//   - e2e: -n fresh messages per cell through a Watermill router on each
//     -brokers broker (Kafka on an in-process kfake), at each -c, without
//     deduplication (none), with ours on Redis with the defaults (idem),
//     and with the floor dedup (floor: SET NX PX before the handler, SET XX
//     PX after it, DEL after a failure, on the same client and
//     auto-pipeliner as ours; a cost reference, never a deduplication to
//     use). Each cell gives its rate and the CPU per message of this
//     process (getrusage) and of the store's Redis (INFO cpu).
//
// Concurrency c is how many messages a consumer may handle at once: c
// handlers on one topic in one group (Redis Streams, RabbitMQ, NATS), one
// handler on c partitions (Kafka), c handlers on c topics (gochannel).
//
// A target whose section, broker or concurrency did not run reads "not
// measured". -json prints the report as JSON instead: every figure, and
// targets with stable ids, values and bounds. Every key, stream, queue and
// table a run writes is its own and deleted at the end. Usage:
//
//	go run ./cmd/idembench
//	go run ./cmd/idembench -sections e2e -c 64 -brokers gochannel
package main
