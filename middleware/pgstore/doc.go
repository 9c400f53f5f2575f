// Package pgstore is the PostgreSQL implementation of idempotency.Store, on
// pgx v5 (a *pgxpool.Pool), for any number of processes sharing one
// database. Keeping the idempotency records in the database that holds a
// handler's effects lets the effect and its COMPLETED record commit in one
// transaction (CompleteInTx, in the handler): the only way to exactly-once
// effects that are not themselves idempotent.
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	store, err := pgstore.New(pool, pgstore.Config{}) // table idempotency_keys
//	err = store.Migrate(ctx)                          // once, or run Schema's DDL yourself
//
// # Schema
//
// One table (Config.Table, default idempotency_keys) with one row per key,
// created by Migrate or by the DDL that Schema returns; the store never runs
// DDL on its own, and New does not touch the database. The columns:
//
//	key_hash     bytea PRIMARY KEY  SHA-256 of the key (sha256(key) in SQL)
//	key          bytea NOT NULL     the key itself, for operators
//	state        text NOT NULL      'in_progress', 'completed' or 'failed'
//	token        bytea              the owner's token while in_progress; the
//	                                completing or failing token afterwards
//	                                (it recognises a resent Complete or Fail;
//	                                NULL after a Release); never reported
//	                                but to its holder
//	attempts     integer NOT NULL   claims that started a run, >= 1
//	fingerprint  bytea              the first claim's fingerprint, or NULL
//	result       bytea              the stored output; NULL unless completed
//	created_at   timestamptz        first claim
//	updated_at   timestamptz        last transition
//	lease_until  timestamptz        lease deadline; NULL unless in_progress
//	claim_ttl_us bigint             the claim's TTL in µs: how long an
//	                                in_progress row outlives its deadline
//	expires_at   timestamptz        when the row counts as absent
//
// Keys, tokens and values are arbitrary bytes (NUL and invalid UTF-8
// included), so they are bytea, which text is not; the key is found through
// its hash because a B-tree entry holds at most about 2.7 kB and keys may be
// longer. A CHECK constraint (idempotency_record_valid) states the record's
// invariants, and an index on expires_at serves Purge. A table created by
// other means must have the columns and the primary key; the constraint and
// the index are advised, not assumed.
//
// # Semantics
//
// Those of idempotency.Store, as memstore and redisstore have them, and
// checked by storetest:
//
//   - Claim of an absent, expired or FAILED key, or of a lapsed lease,
//     acquires it under the caller's token. A lease that lapsed stays in its
//     row until lease_until plus the claim's TTL: it reads as FAILED (no
//     token, LeaseExpiresAt the lapsed deadline, attempts kept), its owner
//     is fenced (Renew, Complete and Fail answer idempotency.ErrLeaseLost
//     whether or not anyone claimed since), and the next claim counts
//     attempt n+1 with created_at kept. An expired row counts as absent: the
//     claim overwrites it, in the same statement, as attempt 1.
//   - A claim resent by the token that holds a live lease acquires again
//     without counting an attempt; its lease counts from now. A Complete or
//     Fail resent by the token whose Complete or Fail was applied returns
//     nil and changes nothing; any other token gets ErrLeaseLost. The
//     completing token's Renew of its COMPLETED row gets
//     idempotency.ErrCompletedByOwner (see Transactional completion).
//     COMPLETED is terminal until it expires.
//   - A fingerprint that differs from a stored one never acquires.
//   - Renew moves lease_until to lease from now and expires_at with it.
//     Complete and Fail keep the row for their TTL from the transition.
//     Release undoes a live lease of its token: a first attempt's row is
//     deleted, a later attempt's is FAILED again with one attempt fewer, no
//     token, and the claim's TTL from now.
//   - Get of an expired row reads absent; Delete removes any row.
//   - Durations are stored in whole microseconds, rounded up, after a lease
//     or TTL longer than idempotency.MaxTTL (100 years) is clamped to it
//     (idempotency.ClampTTL): "forever" (time.Duration(math.MaxInt64))
//     would otherwise round over into a negative interval, a lease already
//     over, or past PostgreSQL's last timestamp.
//
// # One statement per transition
//
// Every transition, the duplicate check (which is the claim itself) and Get
// is one SQL statement: one round trip, atomic on the server, race-free
// under READ COMMITTED. Claim is an INSERT … ON CONFLICT DO UPDATE that
// decides on the latest version of the row under its lock, and returns it;
// a duplicate of a COMPLETED key is answered from the statement's snapshot
// without a lock or a write. Renew, Complete and Fail are an UPDATE whose
// WHERE is the fence (the token holds a live lease of a well-formed row),
// and Release a DELETE or an UPDATE; when nothing was applied, the same
// statement returns the row, to tell a resent transition, a corrupt row and
// a lost lease apart. pgx prepares and caches each statement per connection;
// they work as well in its other query modes (simple protocol, for a
// PgBouncer in transaction mode, say). The statements are in sql.go, each
// with its reasoning.
//
// # Clock
//
// Every time is the server's: statement_timestamp(), read once per
// statement, never the client's clock. For the store's own statements
// (autocommit) it equals now(). Inside a longer transaction, as with
// CompleteInTx, now() would be the transaction's start, and a transaction
// begun while a lease was live could complete it after it lapsed;
// statement_timestamp() is when the statement arrived, so the fence holds
// at the time of the completion. A statement that waits for a row lock
// judges leases by its arrival time; a lease that lapses during such a wait
// is therefore still honoured by it, but only if nobody claimed the key in
// between, since the owner's token is checked on the row as it is after the
// wait. A server clock that steps forward ends leases early, one that steps
// back lengthens them.
//
// # Corrupt records
//
// A row that violates the record's invariants (an unknown state, attempts
// below 1, an in_progress row without a token, lease or TTL, a completed one
// without a result, …) is idempotency.ErrCorruptRecord, wrapped with the
// operation and key, from Claim, Renew, Complete, Fail, Release and Get. The
// statements test the same invariants in SQL before they write, so such a
// row is never overwritten, never taken for a duplicate, and never revived
// by a claim; the decoding checks them again in Go, since the table may lack
// the constraint. Delete removes it; Purge removes it once its expires_at
// has passed.
//
// # Purge
//
// Expired rows count as absent at once, but stay in the table until Purge
// deletes them, in batches bounded by its argument, found through the
// expires_at index. Run it every few minutes from one goroutine (PurgeEvery
// runs that loop); several processes may run it at once, and it never deletes a
// row a claim is reviving. Without it the table grows by every key ever
// seen.
//
// # Transactional completion
//
// A handler writes its effect and the COMPLETED record in one transaction:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO ledger (payment, amount) VALUES ($1, $2)", id, amount); err != nil {
//			return err
//		}
//		return store.CompleteInTx(ctx, tx, out...) // ctx is msg.Context()
//	})
//	return out, err
//
// CompleteInTx (for a Watermill handler, with the messages it returns,
// stored for replay) and CompleteValueInTx (for Once.Do's work) find the
// run in the context (idempotency.RunFromContext) and write its fenced
// COMPLETED inside the transaction, a pgx.Tx or, through SQLTx, a *sql.Tx.
// Then:
//
//   - the effect and COMPLETED commit together or not at all: a consumer
//     killed before the commit leaves neither, and the redelivery runs the
//     handler again; one killed after it leaves both, and the redelivery is
//     a duplicate;
//   - if the lease was lost (another consumer took the key over after this
//     one stalled past its lease), the fence fails with ErrLeaseLost and the
//     transaction rolls back, effect included;
//   - the middleware writes no second COMPLETED: a fresh message costs the
//     claim and the handler's own transaction;
//   - the handler must return an error when the commit fails; the key is
//     then failed and the message redelivered;
//   - until the completion is known to have committed, the run keeps its
//     lease: a COMMIT that fails (a deferred constraint, a serialization
//     failure, a dropped connection) leaves the run holding the key, so
//     that work which goes on (Watermill's middleware.Retry inside this
//     middleware, a retry loop in the handler) is never run beside a
//     second consumer's copy, and its context is cancelled with
//     idempotency.ErrLeaseLost if the lease is lost, as before the
//     completion.
//
// Make it the last statement before COMMIT: from it until the commit the
// row is locked, and any claim of the key waits for the commit. CompleteTx
// is the same for callers that manage key, token and TTL themselves (and
// tell the run nothing).
//
// How the run learns that its transaction committed: pgx has no hook on a
// transaction's end, and the COMMIT's answer reaches only the handler. The
// run's lease renewals go on after CompleteInTx, and the row lock makes
// the first renewal sent after it wait for the transaction to end. If the
// transaction committed, the renewal finds the key COMPLETED under the
// run's own token and Renew answers idempotency.ErrCompletedByOwner: the
// lease ends quietly, the context is not cancelled, and the middleware
// writes no second COMPLETED. If it rolled back, the renewal succeeds: the
// run goes on holding its lease, and if the handler then succeeds without
// another CompleteInTx, the middleware writes COMPLETED as for any other
// handler. A handler that succeeds before a renewal told is trusted: it
// must return an error unless the transaction of its last CompleteInTx
// committed. With Watermill's Retry inside this middleware, the handler is
// Retry's whole run: an attempt that follows a failed COMMIT and succeeds
// must complete in a transaction of its own; one that succeeds without,
// before a renewal saw the rollback, is taken as committed, and the key,
// never COMPLETED, lapses to FAILED although its message was acked (a
// redelivery would run the handler again). Because a renewal waits while the transaction is open, a
// transaction held open after CompleteInTx for most of a lease has its
// context cancelled with ErrLeaseLost (a COMMIT under that context does
// not happen), as a handler whose renewals fail does.
//
// What to know before using it:
//
//   - Run the transaction at READ COMMITTED, PostgreSQL's default. Under
//     REPEATABLE READ or SERIALIZABLE, the completion reads the record's
//     row as the transaction's snapshot has it, while the owner's own
//     renewals and the claims of duplicates change it. When the row changed
//     since the snapshot, the completion fails with a serialization error
//     (SQLSTATE 40001); when the transaction outlived the lease that its
//     snapshot shows (the original lease, if no renewal came before the
//     snapshot), the snapshot's row fails the fence and the completion
//     answers idempotency.ErrLeaseLost, although the renewals kept the
//     lease. Either way it fails on every delivery of a handler longer than
//     a third of the lease.
//   - A second transaction of the same run (a retry inside the handler
//     after a COMMIT whose answer was lost) gets ErrAlreadyCompleted from
//     its completion and must roll back: its effect is already committed.
//   - The handler must return the error of its COMMIT: a handler that
//     reports success although its transaction rolled back has its message
//     acked with no effect, and nothing redelivers it (the key is completed
//     by the middleware if a renewal saw the rollback, else left to lapse).
//     pgx.BeginFunc returns that error.
//   - A consumer that stalls (or is cut off) between the completion and its
//     COMMIT holds the record's row lock until PostgreSQL ends its session;
//     until then every copy of the key waits. Set
//     idle_in_transaction_session_timeout (below the lease:
//     ApplyPoolSettings sets it on a pool's sessions) and lock_timeout
//     on the application's role, and TCP keepalives on its connections, so
//     that a dead session is ended, and its transaction rolled back, soon.
//   - The HTTP middleware does not offer it (its stored response is what the
//     handler wrote, which a transaction inside the handler cannot know):
//     CompleteInTx returns ErrNoRun there.
//   - It completes runs claimed in this store only: the middleware's
//     Config.Store must be this Store, or a wrapper of it. A run claimed in
//     another store (Redis, say, or a Store on another table) gets
//     ErrForeignRun once the fence found no record of the key in the
//     table, and nothing is written. The transaction may come from any
//     pool on the store's database; one on another database (or
//     search_path) gets an error that says so. When the
//     effects live in PostgreSQL, this store is the store: no Redis is
//     needed beside it.
//
// # database/sql
//
// The store needs pgx's pool. A program that uses database/sql opens a
// *pgxpool.Pool from the same connection string beside its *sql.DB (a few
// connections suffice), or, with pgx's own driver, builds its *sql.DB from
// the pool: sql.OpenDB(stdlib.GetPoolConnector(pool)), so that both share
// the connections. Its transactions reach CompleteInTx through SQLTx, with any
// driver that takes $1 placeholders and maps []byte to bytea (pgx's stdlib
// does).
//
// # Errors
//
// Errors name the operation and the key (a key longer than 64 bytes is
// shortened, with its length); pgx.ErrNoRows is never returned. A missing
// table says so, and how to create it. A call cut short by its context
// returns an error matching the context's.
package pgstore
