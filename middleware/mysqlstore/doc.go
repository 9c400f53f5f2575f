// Package mysqlstore is an [idempotency.Store] on a MySQL 8.0+ or MariaDB
// 10.6+ (InnoDB) table, through database/sql and
// github.com/go-sql-driver/mysql. Any number of processes may share the
// table. With the records beside a handler's effects, the effect and its
// COMPLETED record commit in one transaction ([Store.CompleteInTx]). That
// gives exactly-once effects that need not be idempotent themselves.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	store, err := mysqlstore.New(db, mysqlstore.Config{}) // table idempotency_keys
//	err = store.Migrate(ctx)                               // or run Schema's DDL yourself
//
// It is tested on MariaDB 10.11; MySQL 8 is untested. docs/GUARANTEES.md
// ("mysqlstore in detail") has the columns, the locks of each statement,
// where MySQL, MariaDB and PostgreSQL differ, and every case below at
// length.
//
// # Isolation: what to set
//
// Run the handler's transaction at READ COMMITTED:
// db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}), or
// set it as the sessions' default in the DSN. The store's own statements
// need autocommit, the server's default.
//
//   - The fence holds at every level: the completion is an UPDATE, which
//     reads the row's latest committed version.
//   - REPEATABLE READ leaves gap locks behind a refused completion.
//   - With MariaDB's innodb_snapshot_isolation=ON (11.8's default) it fails
//     every completion whose row a renewal changed (error 1020).
//
// A consumer stalled before its COMMIT holds the key's row lock. Set on the
// application's sessions, below the lease: idle_write_transaction_timeout
// (MariaDB; MySQL 8 has only wait_timeout) and innodb_lock_wait_timeout.
//
// # Schema
//
// One table holds one row per key ([Config.Table]). [Store.Migrate]
// creates it unless it exists, under the server's metadata lock. It is safe
// at every start, from many processes at once, and never alters a table.
// It commits implicitly: run it outside a transaction. [Schema] returns the
// same DDL for your own migrations. New touches nothing. The key's row is
// found by its SHA-256, so keys may be any bytes, of any length (up to
// max_allowed_packet). A CHECK constraint states the record's invariants.
// Tokens over 255 bytes and fingerprints over 65535 are refused.
//
// # Semantics
//
// Those of [idempotency.Store], as pgstore has them, checked by storetest.
// A lapsed lease reads as FAILED and keeps its attempts. A resent claim,
// Complete or Fail of the holder changes nothing and succeeds.
//
// # Statements and round trips
//
// Each statement is prepared once per connection, so each costs one round
// trip. No DSN option is needed, and none changes what the store reads.
//
//   - Claim: two statements. MySQL has no RETURNING: an INSERT … ON
//     DUPLICATE KEY UPDATE decides under the row's lock, then a SELECT
//     reads the row.
//   - Renew, Complete, Fail: one UPDATE whose WHERE is the fence. When it
//     changes nothing, a second statement reads the row, to tell a resend,
//     a corrupt row and a lost lease apart.
//   - Release: a DELETE, else an UPDATE, else the read.
//   - Get, Delete: one statement. A purge: a short transaction.
//
// So a fresh message costs 3 round trips, a duplicate 2. Completed in the
// handler's transaction, a fresh message costs 2 outside it and 1 inside.
// A statement InnoDB rolls back as a deadlock's victim is run again, up to
// five times; in the caller's transaction nothing is retried.
//
// # Clock
//
// Every time is the server's UTC_TIMESTAMP(6), read once per statement,
// also inside a longer transaction. It is UTC, so a session's time_zone
// moves no deadline. Times are microseconds (DATETIME(6)).
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
// them, oldest expiry first. Run [Store.PurgeEvery] in one goroutine per
// process. Several processes may purge at once; a purge never deletes a
// row a claim is reviving, and waits for no lock. Without it the table grows by every key ever
// seen.
//
// # Transactional completion
//
//	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
//	…
//	if _, err := tx.ExecContext(ctx, "INSERT INTO ledger (payment, amount) VALUES (?, ?)", id, amount); err != nil {
//		return nil, err // after tx.Rollback
//	}
//	if err := store.CompleteInTx(ctx, tx, out...); err != nil { // ctx is msg.Context()
//		return nil, err
//	}
//	return out, tx.Commit()
//
// [Store.CompleteInTx] (a Watermill handler) and [Store.CompleteValueInTx]
// ([idempotency.Once.Do]) find the run in the context. They write its
// fenced COMPLETED inside the transaction, as pgstore does:
//
//   - The effect and COMPLETED commit together or not at all.
//   - A consumer killed before the commit leaves neither; after it, both
//     (TestKillConsumerProcess, TestConnectionCuts).
//   - A lost lease fails the fence: roll back, effect included.
//   - A second transaction of the run gets [ErrAlreadyCompleted]: roll back.
//   - The middleware writes no second COMPLETED.
//   - The handler must return the error of its COMMIT.
//   - Until a renewal tells the commit happened, the run keeps its lease.
//     A retry after a failed COMMIT never runs beside another copy.
//   - The middleware's Config.Store must be this Store (or a wrapper).
//     A run claimed in Redis or another table gets an error; nothing is
//     written.
//   - A transaction on another database gets an error, unless
//     Config.Table names the store's database ("db.table").
//
// Make it the last statement before COMMIT: the row stays locked until
// then. The next renewal waits for the lock. It finds the key COMPLETED
// under the run's token (the lease ends quietly), or still the run's (the
// transaction rolled back).
//
// # Errors
//
// Errors name the operation and the key (a long key shortened, with its
// length). A missing table says how to create it. A call cut short by its
// context matches the context's error; the driver then closes the
// connection, and the server rolls back what was not committed.
package mysqlstore
