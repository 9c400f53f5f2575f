// Package pgstore is an [idempotency.Store] on a PostgreSQL table, through
// pgx v5 (a [pgxpool.Pool]). Any number of processes may share the table.
// An effect and its COMPLETED record can commit in one transaction
// ([Store.CompleteInTx]): exactly-once effects that need not be idempotent.
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	store, err := pgstore.New(pool, pgstore.Config{}) // table idempotency_keys
//	err = store.Migrate(ctx)                          // or run Schema's DDL yourself
//
// docs/GUARANTEES.md ("pgstore in detail") has the columns, the
// statements' reasoning and every case below at length.
//
// # Records
//
// One row per key ([Config.Table]), found by the key's SHA-256, with a
// CHECK constraint; [Store.Migrate] or [Schema] creates it. A lapsed lease
// reads as FAILED and keeps its attempts; a holder's resend changes
// nothing. Durations are whole microseconds, rounded up. Every time is the
// server's statement_timestamp(), so the fence of [Store.CompleteInTx]
// holds at the completion. A row that breaks the invariants is
// [idempotency.ErrCorruptRecord]: never overwritten, never a duplicate.
// Expired rows read as absent until [Store.PurgeEvery] deletes them.
//
// # One statement per transition
//
// Each transition, the duplicate check and Get is one statement, atomic
// and race-free under READ COMMITTED. Claim is an INSERT … ON CONFLICT DO
// UPDATE that returns the row; a COMPLETED duplicate takes no lock and
// writes nothing. Renew, Complete and Fail are an UPDATE whose WHERE is
// the fence; a refused one returns the row, to tell a resend, a corrupt row
// and a lost lease apart. A fresh message costs 2 statements, a duplicate
// 1, and one completed in the handler's transaction 1 outside it. pgx's
// simple protocol works too (PgBouncer).
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
// ([idempotency.Once.Do]) write the run's fenced COMPLETED in the caller's
// transaction:
//
//   - The effect and COMPLETED commit together or not at all.
//   - A lost lease fails the fence; a second transaction of the run gets
//     [ErrAlreadyCompleted]: roll back.
//   - The handler must return its COMMIT's error. Until a renewal learns
//     of the commit, the run keeps its lease.
//   - Use READ COMMITTED, the default: under REPEATABLE READ it fails.
//   - Set idle_in_transaction_session_timeout below the lease
//     ([ApplyPoolSettings] does), lock_timeout, and TCP keepalives.
//   - The middleware's Config.Store must be this Store; a transaction on
//     another database (or search_path) is an error.
//
// Make it the last statement before COMMIT: the row stays locked until
// then. The next renewal finds the key COMPLETED under the run's token, or
// still the run's after a rollback.
//
// A *sql.DB can share the pool: sql.OpenDB(stdlib.GetPoolConnector(pool)).
// A *sql.Tx reaches CompleteInTx through the adapter [Querier] shows.
//
// Errors name the operation and the key. A missing table says how to create
// it. A call cut short by its context matches the context's error.
package pgstore
