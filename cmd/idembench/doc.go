// Command idembench measures what the idempotency middleware costs per
// message, side by side with what it is compared against, in one run, and
// ends with a table of every performance target of the project, met or
// missed:
//
//   - chain: the middleware chain alone, no broker, handler doing nothing:
//     no deduplication, Watermill's Deduplicator (in-memory repository), ours
//     on memstore, ours on Redis with the defaults (redisstore: the store's
//     auto-pipelining and the middleware's local cache of COMPLETED records
//     on), the same with auto-pipelining off (redisstore-nopipeline) and
//     with the cache off (redisstore-nocache), ours on PostgreSQL (pgstore,
//     and pgstore-tx whose handler books a row and completes in its own
//     transaction: BEGIN, INSERT, CompleteInTx, COMMIT), ours on MySQL or
//     MariaDB (mysqlstore, and mysqlstore-tx, the same in a READ COMMITTED
//     transaction), and a naive Redis GET-then-SET reference. Duplicates cycle through 1024 completed keys,
//     each sent once more unmeasured first, so that a cache meets them warm;
//   - latency: the fresh c=1 redisstore cell, -rounds times with
//     auto-pipelining off and as many with it on, alternating (off, on,
//     on, off, off, on, ...), -d each; median, min and max of the time per
//     message of each;
//   - ceiling: the rate at which the same Redis serves our store's claim
//     to 64 clients, without pipelining (redis-benchmark -P 1, and a raw
//     go-redis load generator) and with it (redis-benchmark -P 16), so that
//     our Redis rate reads as a fraction of each. The claim and complete are
//     captured as the floor section captures them (below), not written
//     down: a fresh claim is one SET NX PX GET and a complete
//     one EVALSHA. A fresh message costs two commands, so a message ceiling
//     is half the claim rate. redis-benchmark takes its arguments from the
//     command line, which holds no NUL byte: it sends the claim's NUL bytes
//     as 0x01, every length kept (the note says so). The raw go-redis load
//     also sends claim+complete pairs, the captured commands with the key
//     changed;
//   - floor: the commands our store sends per message against the least a
//     Redis deduplication can send, side by side on one Redis. The floor's
//     fresh message is SET key 1 NX PX 60000, then SET key done XX PX
//     86400000; its duplicate a GET. Ours are captured, not written down:
//     a go-redis hook watches a real redisstore.Store (auto-pipelining off)
//     claim and complete a fresh template key with one token and claim it
//     again, COMPLETED, with another, after a warm-up message and duplicate
//     on a key of their own that load every script (what is captured is
//     what the store sends per message, not a NOSCRIPT and its fallback).
//     Those commands are then sent again with only the key changed (every
//     fresh key claimed and completed by the same token, which is valid);
//     whatever the store's codec becomes, the section measures it. A
//     captured argument that holds the template key inside a larger value,
//     a command that touches another key (COMMAND GETKEYS) or one that
//     failed stops the run rather than measure something else. Load: 64
//     connections, each sending pipelines of 16 commands (the
//     redis-benchmark -c 64 -P 16 shape) from one goroutine: a fresh
//     message's first commands (the claim) go in one pipeline and its
//     second (the complete) in the next of the same connection, so each
//     pipeline carries as many claims of new messages as completes of
//     earlier ones (8 and 8 for two commands); duplicates cycle through
//     8192 keys the store completed (the floor GETs the same keys when a
//     COMPLETED record is a string, keys of its own holding "done"
//     otherwise). -floor-rounds rounds of -floor-d per load and side,
//     alternating (floor, ours, then ours, floor, ...); fresh keys are new
//     in every round and unlinked after it. Reported per side: the rate of
//     each round and their median; Redis's own time per message by INFO
//     commandstats (the usec of the commands the load sent, over its
//     messages; where Redis counted a command more often than the load sent
//     it, the rest ran inside a script whose usec holds them already, and
//     only the load's share of that command's usec counts), by INFO cpu (the
//     main thread's CPU time per message: commands and their socket work),
//     and how busy the main thread was (near 100 %, Redis is the limit;
//     well below, the client). The ratio of a load is the median over the
//     rounds of ours' rate over the floor's of the same round. Checks: no
//     error reply, no nil reply where the load needs a key (a fresh key
//     that was there, a duplicate that was not), the first and last fresh
//     key of every connection COMPLETED (ours, by the store's Get) or
//     "done" (the floor), and after the duplicates every one of their keys
//     still COMPLETED with the attempts it had. It runs on a private
//     redis-server when redis-server is on PATH (clean commandstats, no
//     other client), else on the shared Redis (noted: other clients'
//     commands then count too), and deletes its keys; it never flushes;
//   - stats: on a private redis-server, the Redis cost per message: commands
//     (INFO commandstats deltas of top-level commands, and a go-redis hook
//     on the client) and round trips (the hook: a Process call is one, a
//     ProcessPipeline call is one) of fresh messages, of duplicates with the
//     cache off and of duplicates with the cache warm, at each concurrency,
//     with auto-pipelining off and on; renewals of slow handlers; bytes of
//     memory per COMPLETED key (MEMORY USAGE); and for pgstore, with the
//     cache off, statements sent per fresh message, per duplicate and per
//     fresh message completed in the handler's transaction (a pgx tracer on
//     the pool: each statement is one round trip); and the same for
//     mysqlstore (its connections wrapped to count every statement sent and
//     every statement prepared: each is one round trip);
//   - e2e: messages per second through a real Watermill router for each
//     broker (gochannel, Kafka on an in-process kfake broker, Redis Streams,
//     RabbitMQ, NATS JetStream), without deduplication (none), with the
//     middleware (idem: ours on Redis, the defaults) and with the floor
//     (floor: SET key 1 NX PX lease before the handler, a key already there
//     acked as a duplicate; SET key done XX PX ttl after it succeeds; DEL
//     after it fails; nothing else: no token, fencing, renewal, stored
//     output or attempts), whose commands ride the same go-redis deferred
//     auto-pipeliner as our store on the same client, fresh messages, then
//     the same keys again as duplicates (which the middleware's cache holds
//     from the fresh phase), at each concurrency. ours ÷ none is the
//     headline; ours ÷ floor says what our store's commands cost beyond the
//     two a message needs at least. A second table gives each cell's CPU
//     per message, this process's (router, broker client, middleware:
//     getrusage) and the store's Redis's (INFO cpu, its main thread), and
//     Redis's reads per message (INFO's total_reads_processed: one read is
//     one batch a connection delivered), from the router's start to its
//     close: on two shared cores a rate is the sum of these costs, and this
//     table says which side of the difference is whose.
//
// Concurrency c is the number of messages a consumer may be handling at once:
// c router handlers on one topic in one consumer group (Redis Streams,
// RabbitMQ, NATS: competing subscriptions, each handling one message at a
// time); one handler on a topic of c partitions (Kafka: one in flight per
// partition); c handlers on c topics (gochannel, which fans every message out
// to every subscriber, so competing subscriptions do not exist). In the chain
// section it is the number of goroutines calling the chain.
//
// # Targets
//
// The last table has one row per target, whatever sections ran: a target
// whose figures were not measured (its section, concurrency or broker was
// left out) says "not measured" and what it needs. A time ratio is ours
// over the other's time per message, which is the other's rate over ours.
// The c=1 latency target is met when the median of the rounds with
// auto-pipelining is at most the slowest round without it: within the
// spread of the runs without it, or faster. Bounds: in the floor section a
// fresh message's store commands reach at least 0.5 of the floor's rate and
// a duplicate's at least 0.5 of GET's; end to end at c=64 ours keeps at
// least 0.8 of the floor's rate for fresh messages on every broker
// (duplicates are left out: the floor asks Redis where ours answer from the
// local cache); duplicates with a warm cache cost 0 Redis commands, and
// take at most 1.2 times the Deduplicator's time at c=1 and c=64; fresh
// messages at c=64 reach at least 0.8 of the -P 16 message ceiling (and 0.7
// of the -P 1 one); memstore's fresh sequential messages take at most 1.3
// times the Deduplicator's time; end to end at c=64 the middleware keeps at
// least 0.8 of the rate without it on Redis Streams, RabbitMQ and NATS,
// fresh and duplicates; a fresh message costs 2 Redis commands and a
// duplicate without cache 1, in every cell; a handler shorter than lease/3
// sends no renewal; a COMPLETED key without output takes less than 150
// bytes; pgstore sends 2 statements per fresh message, 1 per duplicate, and
// 1 outside the handler's transaction when the completion rides in it;
// mysqlstore, whose claim is a write and a read, 3, 2 and 2.
//
// # JSON
//
// -json prints the report as one JSON object instead of the tables (-o
// writes it to a file beside them). Its layout is versioned by
// schema_version (2): a field may be added without a new version; one
// renamed, removed or changing meaning makes a new one. Sections that did
// not run are left out; targets is always there.
//
// -cpuprofile file writes a CPU profile of the whole run (every section
// that runs, the Redis servers it starts excepted) for go tool pprof.
//
//	schema_version  2
//	machine         {goos, goarch, cpus, gomaxprocs, go_version, cpu_model}
//	started         RFC 3339 time, UTC
//	prefix          the prefix of every key, stream, queue of the run
//	config          {sections, n, chain_seconds, ceiling_seconds,
//	                 floor_seconds, floor_rounds, rounds, stats_messages,
//	                 concurrency: [int], brokers: [string]}
//	chain, e2e      [rate]
//	latency         {rounds, seconds, off: spread, on: spread, rule, met}
//	ceiling         {claim_sha ("" for a plain claim), finish_sha,
//	                 commands ("SET, EVALSHA"), clients, redis_benchmark_claims,
//	                 go_claims, go_messages, message_ceiling, pipeline,
//	                 redis_benchmark_claims_pipelined,
//	                 message_ceiling_pipelined, note}
//	floor           {server, clients, pipeline, rounds, seconds,
//	                 ours_claim: [string], ours_complete: [string],
//	                 ours_duplicate: [string], fresh: pair, duplicate: pair,
//	                 note}
//	stats           {server, messages, cost: [cost], fresh_script_inner,
//	                 slow_handler: renewals, fast_handler: renewals,
//	                 key_bytes, memory_no_output, used_memory_no_output,
//	                 memory_with_output, used_memory_with_output,
//	                 output_bytes, encoding, note}
//	pg_stats        {fresh, duplicate, fresh_tx, tx_handler, tx_store,
//	                 prepares, messages}
//	mysql_stats     {fresh, duplicate, fresh_tx, tx_handler, tx_store,
//	                 prepares, messages}
//	ratios          [{load, concurrency, memstore_vs_watermill,
//	                 redis_vs_watermill, redis_vs_none, redis_vs_naive,
//	                 pg_vs_redis, mysql_vs_redis, redis_vs_ceiling,
//	                 redis_vs_pipelined_ceiling}]
//	e2e_ratios      [{broker, concurrency, load, idem_vs_none, idem_vs_floor}]
//	targets         [target]
//
//	rate      {section, broker, dedup, load, concurrency, messages, seconds,
//	           per_second, cache_hits, cache_misses, client_cpu_usec,
//	           redis_cpu_usec, redis_reads, note}
//	spread    {micros: [µs per message of each round, in run order],
//	           median, min, max}
//	cost      {load, auto_pipelining, concurrency, server_commands,
//	           client_commands, round_trips, cache_hits, cache_misses}
//	renewals  {lease, handler, commands_per_message}
//	target    {id, figure, target, measured, result, value, compare, bound}
//	pair      {floor: side, ours: side, rate_ratio, usec_ratio}
//	side      {commands, commands_per_message, messages, rates: [msg/s of
//	           each round, in run order], per_second (their median),
//	           redis_usec, redis_cpu_usec (µs per message), redis_busy}
//
// Rates are messages per second; ratios are of rates (below 1 is slower)
// and 0 where not measured, except a floor pair's usec_ratio, ours'
// redis_usec over the floor's (above 1 costs Redis more); counts are per
// message. A floor pair's floor side is SET NX, SET XX for fresh messages
// and GET for duplicates; its rate_ratio is the median of the rounds'
// ratios; redis_busy is a fraction of the measuring time. A rate's dedup is a
// chain name (none, watermill, memstore, redisstore, redisstore-nopipeline,
// redisstore-nocache, pgstore, pgstore-tx, mysqlstore, mysqlstore-tx,
// naiveredis) or, end to end, none,
// idem or floor; its load is fresh or duplicate; broker is set end to end only;
// cache_hits, cache_misses and every note are left out when zero or empty. A
// cost's load is fresh, duplicate-nocache or duplicate-warm. A target's id
// never changes for a target (fresh_commands_vs_floor, dup_commands_vs_get,
// e2e_c64_fresh_vs_floor_{gochannel,kafka,redis,amqp,nats},
// dup_warm_redis_commands,
// dup_warm_chain_vs_watermill_c1, dup_warm_chain_vs_watermill_c64,
// fresh_c64_vs_pipelined_ceiling, fresh_c1_latency,
// e2e_c64_{fresh,duplicate}_{redis,amqp,nats},
// fresh_redis_commands, dup_nocache_redis_commands, renewals,
// completed_key_bytes, fresh_c64_vs_ceiling, pg_fresh_statements,
// pg_duplicate_statements, pg_fresh_tx_statements, mysql_fresh_statements,
// mysql_duplicate_statements, mysql_fresh_tx_statements); its result is "met",
// "missed" or "not measured" (a missed target changes nothing else: the
// exit status says only whether the run completed); value is the number compared with bound by
// compare ("<", "<=", ">=", or "==" within 0.005), 0 when not measured.
//
// # Resources
//
// PostgreSQL is PG_URL or -pg (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable; an empty -pg leaves it
// out); the pool has as many connections as the highest concurrency. MySQL
// or MariaDB is MYSQL_URL or -mysql (default mysql://root@127.0.0.1:3306/test;
// an empty -mysql leaves it out), with as many connections.
//
// The floor and stats sections start a private redis-server on a free
// loopback port when redis-server is on PATH, and stop it at their end.
// Every key it writes starts with a unique prefix and is deleted at the end,
// and its PostgreSQL and MySQL tables (idembench_*) are its own and dropped at the end;
// it never flushes a database. Usage:
//
//	go run ./cmd/idembench -n 3000 -d 2s   # everything, about three minutes
//	go run ./cmd/idembench -sections chain,ceiling -d 3s
//	go run ./cmd/idembench -sections latency -rounds 7
//	go run ./cmd/idembench -sections floor -floor-rounds 5 -floor-d 1s
//	go run ./cmd/idembench -brokers gochannel,kafka -n 5000 -json
package main
