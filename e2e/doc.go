// Package e2e runs one table of failure scenarios, unchanged, against every
// broker the backends package supports, on real servers, with the
// idempotency middleware keeping its state in a real Redis (redisstore),
// and again on two brokers with PostgreSQL (pgstore) as the store.
//
//	go test -race -count=1 -v ./e2e/...
//	go test -v -run 'TestE2E/kafka/crash' ./e2e/
//
// Subtests are named TestE2E/<broker>/<scenario>, brokers being kafka,
// redis, amqp, nats and gochannel, and scenarios:
//
//   - duplicate-storm: 1,000 keys, each published 5 times (three copies share
//     a UUID, two have their own), consumed by 4 competing consumers.
//   - flaky-handler: 30% of handler attempts fail; each is retried until it
//     succeeds.
//   - concurrent-copies: two copies of each key published together, so that
//     two consumers hold the same key at once.
//   - crash: a consumer in a child process (this test binary, re-executed)
//     is killed with SIGKILL while its handlers run; the broker redelivers,
//     and the survivors take the keys over once the 2 s lease expires.
//   - store-outage: the store is a private redis-server (with an
//     append-only file, as a production store keeps its data) that is killed
//     for 5 s in the middle of a run and restarted. The lease is 20 s here,
//     longer than the outage even when a loaded machine stretches it, as
//     production's 40 s is longer than a failover:
//     with a shorter one, a handler that succeeded during the outage gives
//     up writing COMPLETED (complete_failed) and an outstanding copy runs it
//     again, as OutcomeCompleteFailed documents.
//   - slow-handler: a handler runs 5 s, 2.5 times its lease, while copies of
//     its message come back: published again, and on Redis Streams and NATS
//     also redelivered by the broker's own timer (MaxIdleTime, AckWait).
//   - output-replay: a handler publishes to a downstream topic whose
//     consumer is deduplicated too; the first publish of every produced
//     message fails (lost, or sent but reported failed), the router nacks,
//     and the redelivery replays the stored output with the same UUID.
//   - crash-loop: a poison message kills its consumer, a child process
//     restarted after each death under the same name, every time its
//     handler runs (os.Exit before the key is completed or failed). With the
//     recommended stack (PoisonQueue filtered by IsPermanent outside the
//     middleware, MaxAttempts 3), its attempts outlive the lapsed leases: it
//     runs 3 times, and its fourth delivery goes to the poison topic, once,
//     while 40 other keys, published with it and after the first death, are
//     each processed once. The child's outcomes go to the ledger.
//   - requeue: one key's handler fails until it is fixed. With the
//     recommended stack (MaxAttempts 3) it runs 3 times and goes to the
//     poison topic, while 20 other keys are each processed once; then the
//     handler is fixed and Watermill's requeuer, in a group of its own on
//     the poison topic, publishes it back to the topic it came from. No
//     key is released: the requeued copy gets a fresh budget and runs
//     once, and a copy republished by hand after that is a duplicate.
//   - broker-restart: the broker is a private server of the scenario's own
//     (a redis-server with an fsync'ed append-only file, a nats-server with
//     its own JetStream store, a RabbitMQ node of its own beside the shared
//     one, a kfake cluster with a data directory), stopped for a second and
//     started again while 300 keys stream in to two consumers; publishes
//     that fail meanwhile are retried with the same UUID. Nothing is lost
//     and each effect happens once. It does not apply to gochannel (no
//     broker to restart), nor, under the race detector, to RabbitMQ and
//     Kafka: watermill-amqp v3.0.2 and sarama v1.43.3 have data races on
//     reconnection (Watermill issue #693, IBM/sarama issue #3017) that
//     -race reports; without -race it runs there too.
//   - stuck-partition (Kafka): on topics with the backends' default
//     partition count, one key's handler fails on every delivery while 120
//     other keys, placed on the other partitions by a pinned partitioner,
//     are each processed once; a key behind the stuck one in its partition
//     waits for it.
//
// Every scenario asserts, from a ledger kept in a separate private
// redis-server (HINCRBY per key), that each key's effect happened exactly
// once and that none is missing; that every published message was acked and
// every delivery settled; that no message was acked before its key's effect
// was recorded; that acks and nacks add up to the middleware's outcomes; and
// that the run ended within its budget. Each prints one line: deliveries,
// handler runs, effects, duplicates acked, nacks and elapsed time. The
// crash-loop scenario, whose consumers are all child processes, checks the
// ledger, the outcomes the children counted in it, the poison topic and the
// poison key's record instead of the in-process counters.
//
// The crash and crash-loop scenarios do not apply to gochannel: a killed
// process takes an in-process channel, and every message in it, down with
// it, so there is no broker left to redeliver. stuck-partition is about
// Kafka's partitions and applies to Kafka alone. Every other scenario runs
// on gochannel, where there are no consumer groups: each consumer receives
// every message, which makes it a harsher duplicate test, not a weaker one.
//
// # PostgreSQL store
//
// The table runs a second time on gochannel and on NATS with pgstore as the
// store, each scenario on a table of its own (dropped at the end):
// TestE2E/pg-gochannel/<scenario> and TestE2E/pg-nats/<scenario>. In
// duplicate-storm, flaky-handler and output-replay the handlers make their
// effects in PostgreSQL instead of the ledger, and write COMPLETED (with
// the output) in the same transaction through pgstore.CompleteInTx; there a
// flaky failure comes after the effect's INSERT, and the rollback must take
// it back. flaky-handler and output-replay run a quarter of the keys on
// these columns, duplicate-storm and concurrent-copies half. The crash child keeps its records in the same
// table. store-outage does not apply: it kills the store's server, and the
// PostgreSQL server is shared; nor, to keep the run short, does crash-loop.
//
// # MySQL store
//
// The table runs once more on NATS with mysqlstore as the store, on the
// shared MariaDB (or MySQL): TestE2E/mysql-nats/<scenario>, with the pg-
// columns' key counts, and the effects of duplicate-storm, flaky-handler
// and output-replay made in MySQL, each in a READ COMMITTED transaction
// with its COMPLETED (mysqlstore.CompleteInTx). The crash and crash-loop
// children keep their records in the column's table. store-outage and
// broker-restart do not apply, as on the pg- columns.
//
// Servers: Redis (REDIS_ADDR, 127.0.0.1:6379), RabbitMQ (AMQP_URL,
// amqp://guest:guest@127.0.0.1:5672/), NATS with JetStream (NATS_URL,
// nats://127.0.0.1:4222), PostgreSQL (PG_URL,
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable), MariaDB or
// MySQL (MYSQL_DSN, root@tcp(127.0.0.1:3306)/test), and Kafka: an in-process kfake cluster of three
// brokers, or the cluster named by KAFKA_BROKERS. redis-server must be on
// PATH for the private store and ledger servers. docker-compose.yml at the
// root of the repository starts all of them on those ports. Everything a run
// creates on a shared server carries a unique run id and is deleted at the
// end; nothing is flushed.
package e2e
