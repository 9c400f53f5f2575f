// Package mysqlstore is the MySQL and MariaDB implementation of
// idempotency.Store, on database/sql with github.com/go-sql-driver/mysql,
// for MySQL 8.0+ and MariaDB 10.6+ with InnoDB, for any number of processes
// sharing one database. Keeping the idempotency records in the database
// that holds a handler's effects lets the effect and its COMPLETED record
// commit in one transaction (CompleteInTx): the only way to exactly-once
// effects that are not themselves idempotent.
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	store, err := mysqlstore.New(db, mysqlstore.Config{}) // table idempotency_keys
//	err = store.Migrate(ctx)                               // once, or run Schema's DDL yourself
//
// It is tested on MariaDB 10.11; MySQL 8 is a target it was written for but
// not tested against (see "Where MySQL and MariaDB differ").
//
// # Isolation: what to set
//
// Run the handler's transaction (the one CompleteInTx joins) at READ
// COMMITTED: db.BeginTx(ctx, &sql.TxOptions{Isolation:
// sql.LevelReadCommitted}), or make it the sessions' default through the
// DSN (?transaction_isolation=%27READ-COMMITTED%27 on MySQL, tx_isolation on
// MariaDB before 11.1), which saves the SET TRANSACTION round trip of each
// BeginTx. The store's own statements run in autocommit, as the server's
// default has them (a DSN that sets autocommit=0 breaks the store). What
// the tests found, at each of InnoDB's levels:
//
//   - The fence holds at all four (TestCompleteTxFencesALostLease,
//     TestCompleteTxAfterRenewals, TestSecondTransactionSeesTheFirstCommit):
//     the completion is an UPDATE, which InnoDB runs as a locking read on
//     the row's latest committed version, never on the transaction's
//     snapshot; the read that classifies a refusal is LOCK IN SHARE MODE for
//     the same reason.
//   - REPEATABLE READ, InnoDB's default, has two costs. When the fence
//     refuses because the row is gone (an operator deleted the key), the
//     UPDATE and the locking read leave a gap lock on the primary key until
//     the transaction ends, and a claim of that key (or of another key whose
//     hash falls in the gap) waits for the rollback (TestCompletionLocks).
//     And under MariaDB's innodb_snapshot_isolation=ON (the default from
//     MariaDB 11.8), a row changed since the transaction's snapshot makes
//     the completion fail with error 1020 "Record has changed since last
//     read": the owner's renewals change it, so every handler that read
//     anything before a renewal could never commit
//     (TestSnapshotIsolationRefusesRepeatableRead). READ COMMITTED has
//     neither.
//   - SERIALIZABLE holds the fence too, but turns the handler's plain reads
//     into shared locks.
//
// The locks each statement takes, all on the record's row alone:
//
//   - a claim (autocommit): the row's exclusive lock, for the statement; a
//     claim of an absent key inserts it;
//   - a renewal, Complete, Fail (autocommit): the row's exclusive lock, for
//     the statement; a renewal refused by its fence then reads the row with
//     a shared lock, for that statement;
//   - the in-transaction completion: the row's exclusive lock, until the
//     transaction ends, so any claim of the key waits for the commit and
//     then finds it COMPLETED (or, after a rollback, still the owner's), and
//     so does the run's own renewal, which tells the run how its
//     transaction ended (see "Transactional completion"); no other key's
//     claim or renewal waits for it (TestCompletionLocks; with an expiry
//     condition an index could serve, MariaDB's rowid filter locked the
//     expires_at index up to its end under REPEATABLE READ and every claim
//     waited, so the statements test expiry through TIMESTAMPDIFF);
//   - Purge: the rows it deletes, and under REPEATABLE READ the gaps of the
//     expires_at index it scanned, for the statement.
//
// A consumer that stalls (or is cut off) between the completion and its
// COMMIT holds the row lock until the server ends its session; until then
// every copy of the key waits, up to innodb_lock_wait_timeout (50 s by
// default) and then fails with error 1205 (the middleware nacks it). Set on
// the application's sessions, through the DSN:
//
//   - MariaDB: idle_write_transaction_timeout (seconds) below the lease:
//     a session idle inside a transaction that wrote is ended and the
//     transaction rolled back (TestIdleTransactionTimeoutEndsAStalledCompletion).
//     It plays PostgreSQL's idle_in_transaction_session_timeout.
//   - MySQL 8 has no such variable; wait_timeout (seconds) ends any idle
//     session, in a transaction or not, so set it below the lease and
//     db.SetConnMaxIdleTime below it in turn.
//   - innodb_lock_wait_timeout (seconds, at least 1) below the lease, so
//     that a claim waiting behind a stalled session fails, and is nacked,
//     before its own lease could matter.
//
// go-sql-driver turns TCP keepalives on (Go's default period, 15 s), so a
// dead peer is found.
//
// # Schema
//
// One table (Config.Table, default idempotency_keys) with one row per key,
// created by Migrate or by the DDL that Schema returns; the store never runs
// DDL on its own, and New does not touch the database. The columns:
//
//	key_hash     BINARY(32) PRIMARY KEY  SHA-256 of the key (UNHEX(SHA2(key, 256)))
//	key          LONGBLOB NOT NULL       the key itself, for operators
//	state        VARBINARY(255) NOT NULL 'in_progress', 'completed' or 'failed'
//	token        VARBINARY(255)          the owner's token while in_progress;
//	                                     the completing or failing token
//	                                     afterwards (it recognises a resent
//	                                     Complete or Fail; NULL after a
//	                                     Release); never reported but to its
//	                                     holder
//	attempts     BIGINT NOT NULL         claims that started a run, >= 1
//	fingerprint  BLOB                    the first claim's fingerprint, or NULL
//	result       LONGBLOB                the stored output; NULL unless completed
//	created_at   DATETIME(6) NOT NULL    first claim (UTC)
//	updated_at   DATETIME(6) NOT NULL    last transition (UTC)
//	lease_until  DATETIME(6)             lease deadline; NULL unless in_progress
//	claim_ttl_us BIGINT                  the claim's TTL in µs: how long an
//	                                     in_progress row outlives its deadline
//	expires_at   DATETIME(6) NOT NULL    when the row counts as absent (UTC)
//
// Keys, tokens and values are arbitrary bytes (NUL and invalid UTF-8
// included), so they are binary strings, compared byte for byte; state is
// one too, so that 'completed ' or 'COMPLETED' is no state. The key is found
// through its hash because an InnoDB index entry holds at most 3072 bytes
// and keys may be longer (1 MiB keys pass the conformance suite); a key
// and a result are bounded by the server's max_allowed_packet (16 MiB on
// MariaDB, 64 MiB on MySQL 8 by default). Tokens longer than
// MaxTokenBytes and fingerprints longer than MaxFingerprintBytes are
// refused (ErrTooLong) before they reach a server that might cut them. A
// CHECK constraint (<table>_record_valid: MySQL names constraints per
// database) states the record's invariants, and an index on expires_at
// serves Purge. A table created by other means must have the columns and
// the primary key; the constraint and the index are advised, not assumed.
//
// # Semantics
//
// Those of idempotency.Store, as memstore, redisstore and pgstore have them,
// and checked by storetest (the whole suite, Once's cases included, passes
// on MariaDB): claims of absent, expired, FAILED or lapsed keys acquire,
// lapsed leases keep their attempts and read as FAILED, resent transitions
// are idempotent for their owner, fingerprints that differ never acquire,
// Release undoes a claim, COMPLETED is terminal until it expires.
// Durations are stored in whole microseconds, rounded up, after a lease or
// TTL longer than idempotency.MaxTTL (100 years) is clamped to it
// (idempotency.ClampTTL): "forever" (time.Duration(math.MaxInt64)) would
// otherwise round over into a negative INTERVAL, a row the CHECK
// constraint refuses or, on a table without it, one the store reads as
// corrupt. Deadlines are DATETIME(6), good to the year 9999: a renewal's
// expiry, lease plus the claim's TTL, is at most two MaxTTLs from now.
//
// # Statements and round trips
//
// Every statement is prepared once per connection (database/sql re-prepares
// a *sql.Stmt on each connection it uses), so each costs one round trip
// whatever the DSN's interpolateParams. No DSN option is needed, and none
// (parseTime, loc, clientFoundRows) changes what the store reads.
//
//   - Claim: two statements. An INSERT … ON DUPLICATE KEY UPDATE decides
//     and writes under the row's exclusive lock; MySQL has no RETURNING
//     (MariaDB none on this path), so a SELECT then reads the row, and the
//     claim acquired iff the row is IN_PROGRESS under the request's token
//     (reported with its deadline even if the lease lapsed in between). A
//     record of another owner that moved on between the two (its holder
//     completed or failed it, its lease lapsed) is claimed again, so no
//     caller is refused by a record that no longer refuses it (see
//     Store.Claim).
//   - Renew, Complete, Fail: one UPDATE whose WHERE is the fence; when it
//     changes nothing, a second statement reads the row to tell a resent
//     transition (nil), a corrupt row and a lost lease apart, and for a
//     renewal the run's own committed completion
//     (idempotency.ErrCompletedByOwner). A renewal is one round trip while
//     the lease holds, two when it is refused; the one renewal that finds
//     the run's in-transaction completion committed costs two, and comes
//     only when a renewal falls due between CompleteInTx and the handler's
//     return (renewals come every third of the lease); sent while that
//     transaction is open, it waits until the transaction ends.
//   - Release: a DELETE (a first attempt), else an UPDATE (a later one),
//     else the read.
//   - Get, Delete, Purge: one statement.
//   - CompleteTx: the UPDATE in the caller's transaction, on its connection.
//
// So a fresh message costs three round trips (claim's two, Complete), a
// duplicate two, and a fresh message completed in the handler's transaction
// two outside it and one inside (cmd/idembench counts them). A statement
// that InnoDB picks as a deadlock's victim (error 1213) was rolled back
// whole and is run again, up to five times; in the caller's transaction
// nothing is retried.
//
// # Clock
//
// Every time is the server's: UTC_TIMESTAMP(6), which MySQL and MariaDB
// read once per statement, when it starts, also inside a longer transaction,
// so the fence of CompleteTx holds at the time of the completion
// (TestCompleteTxReadsTheStatementsClock). It is UTC rather than NOW(6): a
// session's time_zone would otherwise move every deadline, and a DST change
// repeat an hour. Times are microseconds (DATETIME(6)), as PostgreSQL's
// timestamptz. A statement that waits for a row lock judges leases by the
// time it started; a lease that lapses during such a wait is therefore
// still honoured by it, but only if nobody claimed the key in between,
// since the owner's token is checked on the row as it is after the wait. A server clock that steps forward ends leases early, one that
// steps back lengthens them.
//
// # Corrupt records
//
// A row that violates the record's invariants (an unknown state, attempts
// below 1, an in_progress row without a token, lease or TTL, a completed
// one without a result, …) is idempotency.ErrCorruptRecord, wrapped with the
// operation and key, from Claim, Renew, Complete, Fail, Release and Get.
// The statements test the same invariants in SQL before they write, so such
// a row is never overwritten, never taken for a duplicate, and never
// revived by a claim; the decoding checks them again in Go. Delete removes
// it; Purge removes it once its expires_at has passed.
//
// # Purge
//
// Expired rows count as absent at once, but stay in the table until Purge
// deletes them, in batches bounded by its argument, oldest expiry first.
// Run it every few minutes from one goroutine (PurgeEvery runs that loop);
// several processes may run it at once, and it never deletes a row a claim
// is reviving. Without it the table grows by every key ever seen.
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
// CompleteInTx (for a Watermill handler, with the messages it returns,
// stored for replay) and CompleteValueInTx (for Once.Do's work) find the run
// in the context (idempotency.RunFromContext) and write its fenced
// COMPLETED inside the transaction. Then, as with pgstore:
//
//   - the effect and COMPLETED commit together or not at all: a consumer
//     killed before the commit leaves neither, and the redelivery runs the
//     handler again; one killed after it leaves both, and the redelivery is
//     a duplicate (TestKillConsumerProcess: 30 SIGKILLs, 0 doubles, 0 lost;
//     TestConnectionCuts: the connection reset at the claim's reply, after
//     the effect, after the completion and at the COMMIT's reply);
//   - if the lease was lost, the fence fails with idempotency.ErrLeaseLost
//     and the transaction must roll back, effect included;
//   - a second transaction of the same run (a retry after a COMMIT whose
//     answer was lost) gets ErrAlreadyCompleted and must roll back;
//   - ErrNoRun outside a run (the HTTP middleware, whose stored response is
//     what the handler wrote, does not offer it);
//   - ErrForeignRun for a run claimed in another store (Redis, say, or a
//     Store on another table), once the fence found no record of the key
//     in the table: nothing is written. When the effects live in MySQL,
//     this store is the store: no Redis is needed beside it;
//   - the transaction may come from any *sql.DB on the store's database,
//     not only the store's own: in one of another pool the store's
//     statements run as plain queries. One on another database of the
//     server gets an error that says so, unless Config.Table names the
//     store's database ("db.table"), which it then reaches;
//   - the middleware writes no second COMPLETED; the handler must return
//     the error of its COMMIT, or its message is acked with no effect;
//   - until the completion is known to have committed, the run keeps its
//     lease: a COMMIT that fails (a dropped connection, a session the
//     server ended, as idle_write_transaction_timeout or KILL do) leaves
//     the run holding the key, so that work which goes on (Watermill's
//     middleware.Retry inside this middleware, a retry loop in the
//     handler) is never run beside a second consumer's copy, and its
//     context is cancelled with idempotency.ErrLeaseLost if the lease is
//     lost, as before the completion (the tests fail the COMMIT by
//     resetting the consumer's connection through a fault proxy after
//     CompleteInTx: TestFailedCommitWithRetryInsideKeepsTheLease,
//     TestFailedCommitWithHandlerLoopKeepsTheLease,
//     TestLeaseLostDuringRetryAfterFailedCommit).
//
// Make it the last statement before COMMIT: from it until the commit the
// row is locked. CompleteTx is the same for callers that manage key, token
// and TTL themselves (and tell the run nothing).
//
// How the run learns that its transaction committed: database/sql has no
// hook on a transaction's end, and the COMMIT's answer reaches only the
// handler. The run's lease renewals go on after CompleteInTx, and the row
// lock makes a renewal sent after it wait in its UPDATE until the
// transaction ends (at READ COMMITTED too: InnoDB's semi-consistent read
// finds the last committed version still the run's lease, so the UPDATE
// waits for the lock). The UPDATE then tests its fence on the row as the
// transaction left it:
//
//   - committed: the row is COMPLETED under the run's own token, the UPDATE
//     changes nothing, and the read that classifies the refusal, a locking
//     read (LOCK IN SHARE MODE) so that it sees the latest committed
//     version whatever the session's isolation level, finds it so: Renew
//     answers idempotency.ErrCompletedByOwner, the lease ends quietly (the
//     context is not cancelled) and the middleware writes no second
//     COMPLETED (TestCommittedCompletionEndsTheLeaseQuietly,
//     TestLostCommitAnswerWithRetryInside);
//   - rolled back: the row is still the run's lease and the renewal
//     succeeds; the run goes on holding its lease, and if the handler then
//     succeeds without another CompleteInTx, the middleware writes
//     COMPLETED as for any other handler
//     (TestRolledBackCompletionLeavesTheRunRenewed).
//
// TestRenewalWitnessesTheCompletionsEnd checks both answers with the store's
// sessions at the server's REPEATABLE READ and at READ COMMITTED set in the
// DSN. A handler that succeeds before a renewal told is trusted: it must
// return an error unless the transaction of its last CompleteInTx
// committed. Because a renewal waits while the transaction is open, a
// transaction held open after CompleteInTx for most of a lease has its
// context cancelled with idempotency.ErrLeaseLost, and database/sql then
// rolls it back (TestTransactionHeldOpenPastTheLease). A renewal that gives
// up waiting (its context ends, a third of the lease at most) closes its
// connection, but the server runs its UPDATE when the lock is released: if
// the transaction rolled back, that renewal is applied late, and the key
// stays held for at most a lease from when it was sent
// (TestAbandonedRenewalIsAppliedLate). Set
// innodb_lock_wait_timeout on the store's sessions too: a renewal waiting
// past it fails with error 1205, a store error, and is retried.
//
// # Where MySQL and MariaDB differ from PostgreSQL, and from each other
//
//   - Upsert: PostgreSQL's INSERT … ON CONFLICT DO UPDATE has a WHERE and
//     RETURNING, so pgstore's claim is one statement that returns the row.
//     ON DUPLICATE KEY UPDATE has neither: the update always runs (a refusal
//     writes the row back unchanged), its decision is computed once in the
//     first assignment into the session variable @idempotency_claim, since
//     MySQL evaluates a SET list left to right and a later assignment would
//     see the earlier ones' new values, and the row is read by a second
//     statement.
//   - Clock: both microseconds; statement_timestamp() there, UTC_TIMESTAMP(6)
//     here.
//   - Lock waits: PostgreSQL waits forever unless lock_timeout is set;
//     InnoDB gives up after innodb_lock_wait_timeout (50 s) with error 1205,
//     rolling back the statement only.
//   - Idle transactions: PostgreSQL's idle_in_transaction_session_timeout is
//     MariaDB's idle_write_transaction_timeout (also idle_transaction_timeout
//     and idle_readonly_transaction_timeout); MySQL 8 has only wait_timeout.
//   - Isolation: PostgreSQL defaults to READ COMMITTED and its REPEATABLE
//     READ fails a concurrent update (40001); InnoDB defaults to REPEATABLE
//     READ, whose UPDATE reads the latest version instead (unless MariaDB's
//     innodb_snapshot_isolation is ON, error 1020), and which adds gap locks.
//   - MySQL 8, not tested here (this machine has MariaDB only): it
//     deprecates assigning user variables inside expressions (since 8.0.13:
//     a warning, 1287, on every claim that updates; a MySQL that removes
//     the feature would fail the claim's statement, loudly); it enforces
//     CHECK constraints from 8.0.16 (the statements do not rely on them);
//     LOCK IN SHARE MODE is its deprecated synonym of FOR SHARE; it has no
//     innodb_snapshot_isolation (it behaves as OFF) and no
//     idle_*_transaction_timeout; the expiry tests that no index can serve
//     keep its optimizer, too, from scanning expires_at in an owner's
//     statement. Galera and Group Replication were not tested either.
//
// # Errors
//
// Errors name the operation and the key (a key longer than 64 bytes is
// shortened, with its length); sql.ErrNoRows is never returned. A missing
// table says so, and how to create it. A call cut short by its context
// returns an error matching the context's; go-sql-driver then closes the
// connection, and the server rolls back what it had not committed.
package mysqlstore
