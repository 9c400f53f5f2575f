// Command idembench measures what the idempotency middleware costs per
// message, side by side with what it is compared against, in one run:
//
//   - chain: the middleware chain alone, no broker, handler doing nothing:
//     no deduplication, Watermill's Deduplicator (in-memory repository), ours
//     on memstore, ours on Redis, ours on PostgreSQL (pgstore, and pgstore-tx
//     whose handler books a row and completes in its own transaction:
//     BEGIN, INSERT, CompleteInTx, COMMIT), and a naive Redis GET-then-SET
//     reference;
//   - ceiling: the rate at which the same Redis serves our claim script to 64
//     clients without pipelining (redis-benchmark, and a raw go-redis load
//     generator), so that our Redis rate reads as a fraction of it;
//   - stats: from Redis itself, commands per fresh message and per duplicate
//     (INFO commandstats deltas of top-level commands), renewals of slow
//     handlers, and bytes of memory per COMPLETED key (MEMORY USAGE); and
//     for pgstore, statements sent per fresh message, per duplicate and per
//     fresh message completed in the handler's transaction (counted by a
//     pgx tracer on the pool: each statement is one round trip);
//   - e2e: messages per second through a real Watermill router for each
//     broker (gochannel, Kafka on an in-process kfake broker, Redis Streams,
//     RabbitMQ, NATS JetStream), with and without the middleware, fresh
//     messages and duplicates, at each concurrency.
//
// Concurrency c is the number of messages a consumer may be handling at once:
// c router handlers on one topic in one consumer group (Redis Streams,
// RabbitMQ, NATS: competing subscriptions, each handling one message at a
// time); one handler on a topic of c partitions (Kafka: one in flight per
// partition); c handlers on c topics (gochannel, which fans every message out
// to every subscriber, so competing subscriptions do not exist). In the chain
// section it is the number of goroutines calling the chain.
//
// PostgreSQL is PG_URL or -pg (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable; an empty -pg leaves it
// out); the pool has as many connections as the highest concurrency.
//
// Every key it writes starts with a unique prefix and is deleted at the end,
// and its PostgreSQL tables (idembench_*) are its own and dropped at the end;
// it never flushes a database. Usage:
//
//	go run ./cmd/idembench                 # everything, a few minutes
//	go run ./cmd/idembench -sections chain,ceiling -d 3s
//	go run ./cmd/idembench -brokers gochannel,kafka -n 5000 -json
package main
