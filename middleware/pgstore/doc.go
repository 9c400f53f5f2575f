// Package pgstore is an [idempotency.Store] on a PostgreSQL table, through
// pgx v5 (a [pgxpool.Pool]). Any number of processes may share the table.
// With the records beside a handler's effects, the effect and its COMPLETED
// record commit in one transaction ([Store.CompleteInTx]). That gives
// exactly-once effects that need not be idempotent themselves.
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	store, err := pgstore.New(pool, pgstore.Config{}) // table idempotency_keys
//	err = store.Migrate(ctx)                          // or run Schema's DDL yourself
//
// docs/GUARANTEES.md ("pgstore in detail") has the schema's columns, the
// statements' reasoning and every case below at length.
//
// # Schema
//
// One table holds one row per key ([Config.Table]). [Store.Migrate]
// creates it and its expiry index unless they exist. It is safe at every
// start, from many processes at once, and never alters a table. [Schema]
// returns the same DDL for your own migrations. New touches nothing. The
// key's row is found by its SHA-256, so keys may be any bytes, of any
// length. A CHECK constraint states the record's invariants.
//
// # Semantics
//
// Those of [idempotency.Store], checked by storetest:
//
//   - A claim acquires an absent, expired or FAILED key, or a lapsed lease.
//   - A lapsed lease reads as FAILED and keeps its attempts.
//   - A claim resent by the lease's holder acquires again, without a new
//     attempt.
//   - A resent Complete or Fail of the applied token returns nil.
//   - Any other token gets [idempotency.ErrLeaseLost].
//   - A fingerprint that differs from the stored one never acquires.
//   - Durations are whole microseconds, rounded up, clamped to
//     [idempotency.MaxTTL].
//
// # One statement per transition
//
// Each transition, the duplicate check and Get is one statement. One round
// trip, atomic on the server, race-free under READ COMMITTED. Claim is an
// INSERT … ON CONFLICT DO UPDATE that returns the row. A duplicate of a
// COMPLETED key takes no lock and writes nothing. Renew, Complete and Fail
// are an UPDATE whose WHERE is the fence. A refused statement returns the
// row, to tell a resend, a corrupt row and a lost lease apart. So a fresh
// message costs 2 statements, a duplicate 1, and a fresh message completed
// in the handler's transaction 1 outside it. pgx caches each prepared
// statement per connection; its simple protocol works too (PgBouncer).
//
// # Clock
//
// Every time is the server's statement_timestamp(), never the client's.
// Inside a longer transaction it is the statement's arrival, not the
// transaction's start. So the fence of [Store.CompleteInTx] holds at the
// time of the completion.
//
// # Corrupt records
//
// A row that breaks the invariants is [idempotency.ErrCorruptRecord],
// wrapped with the operation and key. The statements test the invariants
// in SQL before they write. Such a row is never overwritten, never a
// duplicate and never revived. Delete removes it.
//
// # Purge
//
// Expired rows read as absent at once, but stay until a purge deletes
// them. Run [Store.PurgeEvery] in one goroutine per process. Several
// processes may purge at once; a purge never deletes a row a claim is
// reviving. Without it the table grows by every key ever seen.
//
// # Transactional completion
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO ledger (payment, amount) VALUES ($1, $2)", id, amount); err != nil {
//			return err
//		}
//		return store.CompleteInTx(ctx, tx, out...) // ctx is msg.Context()
//	})
//	return out, err
//
// [Store.CompleteInTx] (a Watermill handler) and [Store.CompleteValueInTx]
// ([idempotency.Once.Do]) find the run in the context. They write its
// fenced COMPLETED inside the transaction:
//
//   - The effect and COMPLETED commit together or not at all.
//   - A consumer killed before the commit leaves neither; after it, both.
//   - A lost lease fails the fence: roll back, effect included.
//   - The middleware writes no second COMPLETED.
//   - The handler must return the error of its COMMIT.
//   - A second transaction of the run gets [ErrAlreadyCompleted]: roll back.
//   - Until a renewal tells the commit happened, the run keeps its lease.
//     A retry after a failed COMMIT never runs beside another copy.
//
// Make it the last statement before COMMIT: the row stays locked until
// then. The next renewal waits for the lock. It finds the key COMPLETED
// under the run's token (the lease ends quietly), or still the run's (the
// transaction rolled back).
//
// What to set and know:
//
//   - Use READ COMMITTED, PostgreSQL's default. Under REPEATABLE READ the
//     completion reads an old snapshot and fails.
//   - Set idle_in_transaction_session_timeout below the lease
//     ([ApplyPoolSettings] does), lock_timeout, and TCP keepalives.
//     A consumer stalled before its COMMIT then frees the key soon.
//   - The middleware's Config.Store must be this Store (or a wrapper).
//     A run claimed in Redis or another table gets an error; nothing is
//     written.
//   - A transaction on another database (or search_path) gets an error.
//   - The HTTP middleware does not offer it: the context has no run.
//
// # database/sql
//
// The store needs a pgx pool. Build the *sql.DB on it with
// sql.OpenDB(stdlib.GetPoolConnector(pool)) to share connections. A *sql.Tx
// reaches CompleteInTx through the adapter that [Querier] shows.
//
// # Errors
//
// Errors name the operation and the key (a long key shortened, with its
// length). A missing table says how to create it. A call cut short by its
// context matches the context's error.
package pgstore
