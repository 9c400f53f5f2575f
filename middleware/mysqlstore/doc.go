// Package mysqlstore is an [idempotency.Store] on a MySQL 8.0+ or MariaDB
// 10.6+ (InnoDB) table, through database/sql and
// github.com/go-sql-driver/mysql. Any number of processes may share the
// table. An effect and its COMPLETED record can commit in one transaction
// ([Store.CompleteInTx]): exactly-once effects that need not be idempotent.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	store, err := mysqlstore.New(db, mysqlstore.Config{}) // table idempotency_keys
//	err = store.Migrate(ctx)                               // or run Schema's DDL yourself
//
// It is tested on MariaDB 10.11; MySQL 8 is untested. docs/GUARANTEES.md
// ("mysqlstore in detail") has the columns, each statement's locks, how
// MySQL, MariaDB and PostgreSQL differ, and every case below at length.
//
// # Isolation: what to set
//
// Run the handler's transaction at READ COMMITTED; the store's own
// statements need autocommit, the default. The fence holds at every level,
// but REPEATABLE READ leaves gap locks behind a refused completion, and
// with MariaDB's innodb_snapshot_isolation=ON (11.8's default) fails every
// completion whose row a renewal changed (error 1020). Set
// idle_write_transaction_timeout (MariaDB) and innodb_lock_wait_timeout
// below the lease: a consumer stalled before COMMIT holds the row lock.
//
// # Records
//
// One row per key ([Config.Table]), found by the key's SHA-256: keys may be
// any bytes of any length. A CHECK constraint states the invariants.
// [Store.Migrate] creates the table; [Schema] returns its DDL. A lapsed
// lease reads as FAILED and keeps its attempts. A holder's resent claim,
// Complete or Fail changes nothing and succeeds. Every time is the server's
// UTC_TIMESTAMP(6), so a session's time_zone moves no deadline.
//
// A row that breaks the invariants is [idempotency.ErrCorruptRecord]: never
// overwritten, never a duplicate. Delete removes it. Expired rows read as
// absent and stay until [Store.PurgeEvery] deletes them.
//
// # Statements and round trips
//
// Each statement is prepared once per connection: one round trip each.
// Claim is an INSERT … ON DUPLICATE KEY UPDATE that decides under the row's
// lock, then a SELECT (MySQL has no RETURNING). Renew, Complete and Fail
// are an UPDATE whose WHERE is the fence, then a read when it changed
// nothing. Release is a DELETE, else an UPDATE. A purge waits for no lock.
//
// A fresh message costs 3 round trips, a duplicate 2; completed in the
// handler's transaction, 2 outside it and 1 inside. A deadlock's victim is
// run again, up to five times, except in the caller's transaction.
//
// # Transactional completion
//
// [Store.CompleteInTx] (a Watermill handler) and [Store.CompleteValueInTx]
// ([idempotency.Once.Do]) write the run's fenced COMPLETED in the caller's
// transaction, as pgstore does. The effect and COMPLETED commit together or
// not at all (TestKillConsumerProcess, TestConnectionCuts). A lost lease
// fails the fence; a second transaction of the run gets
// [ErrAlreadyCompleted]. The handler must return its COMMIT's error; until
// a renewal learns of the commit, the run keeps its lease. The middleware's
// Config.Store must be this Store; another database is an error unless
// Config.Table names it. The row stays locked until COMMIT: complete last.
//
// Errors name the operation and the key; a call cut short matches ctx's error.
package mysqlstore
