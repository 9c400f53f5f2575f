package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// CompleteTx is Complete run in tx, typically the transaction in which the
// handler made its effect: the effect and the COMPLETED record then commit
// together, or not at all. The fence is Complete's, but stricter: it
// returns idempotency.ErrLeaseLost unless token holds a lease that has not
// lapsed, and ErrAlreadyCompleted when token's own COMPLETED was committed
// before; in both cases the transaction must roll back, effect included.
// Once applied, the row stays locked (an exclusive record lock) until the
// transaction ends, so no claim can take the key over in between; a claim
// of the key waits for the commit and then finds it COMPLETED.
//
// It is one UPDATE, a locking read in InnoDB: at every isolation level it
// judges the fence on the latest committed version of the row, never on
// the transaction's snapshot. Under REPEATABLE READ with MariaDB's
// innodb_snapshot_isolation=ON (MariaDB 11.8's default), a row changed since
// the transaction's snapshot (the owner's own renewals do that) makes it
// fail with error 1020 "Record has changed since last read": run the
// transaction at READ COMMITTED (see the package documentation).
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, key, token string, result []byte, ttl time.Duration) error {
	if tx == nil {
		return wrap(opCompleteTx, key, ErrNilTx)
	}
	err := s.complete(ctx, txRunner{s: s, tx: tx}, opCompleteTx, key, token, result, ttl)
	if err != nil && (errors.Is(err, idempotency.ErrLeaseLost) || isNoSuchTable(err)) && !strings.Contains(s.table, ".") {
		// The fence found no row of ours, or no table: the transaction may
		// be on another database, which has no such table or one of its
		// own, not this store's.
		if txDB, storeDB, ok := s.databases(ctx, tx); ok && txDB != storeDB {
			return wrap(opCompleteTx, key, fmt.Errorf("%w: the transaction is on database %q, the table %s on %q", errOtherDatabase, txDB, s.table, storeDB))
		}
	}
	return err
}

// errOtherDatabase is CompleteTx's error for a transaction on another
// database than the store's unqualified table.
var errOtherDatabase = errors.New("mysqlstore: the transaction is not on the store's database: begin it on a pool of that database, or qualify Config.Table with it")

// databases returns the current database of tx and of the store's pool.
func (s *Store) databases(ctx context.Context, tx *sql.Tx) (txDB, storeDB string, ok bool) {
	var a, b sql.NullString
	if tx.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&a) != nil || s.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&b) != nil {
		return "", "", false
	}
	return a.String, b.String, true
}

// complete is Complete (op "complete": a resend by the owner succeeds) and
// CompleteTx (opCompleteTx: it does not).
func (s *Store) complete(ctx context.Context, q runner, op, key, token string, result []byte, ttl time.Duration) error {
	if err := idempotency.CheckOwner(key, token, ttl); err != nil {
		return wrap(op, key, err)
	}
	if result == nil {
		result = []byte{} // NULL is the absence of a result; an empty one is a value
	}
	return s.owned(ctx, q, op, key, token, s.sql.complete, result, durationMicros(ttl))
}

// opCompleteTx names CompleteTx in errors and tells owned that a COMPLETED
// record of the same token is not a resend.
const opCompleteTx = "complete in transaction"

// ErrNilTx is returned by CompleteTx, CompleteInTx and CompleteValueInTx for
// a nil transaction.
var ErrNilTx = errors.New("mysqlstore: nil *sql.Tx")

// ErrAlreadyCompleted is returned by CompleteTx, CompleteInTx and
// CompleteValueInTx when the run's own COMPLETED record was committed
// before, by an earlier transaction of the same run: its COMMIT succeeded
// though the caller saw an error, and the work was tried again (Watermill's
// Retry inside this middleware, say). Roll the transaction back: its effect
// is already in the database. Unlike Complete, which a client resends with
// nothing else in it, a transaction that completes carries an effect, and
// committing it twice would double the effect.
var ErrAlreadyCompleted = errors.New("mysqlstore: the run already committed its COMPLETED record and its effect")

// ErrNoRun is returned by CompleteInTx and CompleteValueInTx for a context
// that belongs to no run of the idempotency middleware or of Once.Do.
var ErrNoRun = errors.New("mysqlstore: the context belongs to no idempotent run (use the handler's msg.Context() or Do's work context)")

// CompleteInTx writes COMPLETED for the Watermill handler whose context ctx
// is (msg.Context()), inside tx, the transaction that made the handler's
// effect, with the messages the handler will return as the stored output
// (replayed for duplicates, as the middleware stores it). Call it last,
// right before committing tx:
//
//	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
//	if err != nil {
//		return nil, err
//	}
//	defer tx.Rollback()
//	if _, err := tx.ExecContext(ctx, "INSERT INTO ledger …", …); err != nil {
//		return nil, err
//	}
//	if err := store.CompleteInTx(ctx, tx, out...); err != nil {
//		return nil, err
//	}
//	return out, tx.Commit()
//
// The effect and COMPLETED then commit together or not at all. If the
// lease was lost (another consumer took the key over), it returns an error
// matching idempotency.ErrLeaseLost and the transaction must roll back,
// effect included. A run claimed in another store (the middleware's Store
// is Redis, say) gets ErrForeignRun, and nothing is written: this store
// must be the middleware's Store. Once it succeeded, the run keeps renewing
// its lease until a renewal finds the transaction committed (the key
// COMPLETED under the run's token: Renew answers
// idempotency.ErrCompletedByOwner and the lease ends quietly) or rolled
// back (the renewal succeeds and the lease goes on), so that a failed
// COMMIT followed by a retry never runs beside another consumer's copy; see
// the package doc. The middleware does not write COMPLETED again after a
// success; the handler must return an error when the commit fails.
func (s *Store) CompleteInTx(ctx context.Context, tx *sql.Tx, out ...*message.Message) error {
	run, ok := idempotency.RunFromContext(ctx)
	if !ok {
		return ErrNoRun
	}
	return s.completeRun(ctx, tx, run, run.Result(out...))
}

// CompleteValueInTx is CompleteInTx for the work of Once.Do: value, what the
// work returns, is stored as its result and replayed to later callers.
func (s *Store) CompleteValueInTx(ctx context.Context, tx *sql.Tx, value []byte) error {
	run, ok := idempotency.RunFromContext(ctx)
	if !ok {
		return ErrNoRun
	}
	return s.completeRun(ctx, tx, run, value)
}

// ErrForeignRun is returned by CompleteInTx and CompleteValueInTx for a run
// that was claimed in another store: the middleware's Config.Store is
// Redis, say, or a Store of this package on another table, while the
// handler completes in this one. The fence would fail there on every
// attempt (the key has no record in this table), so nothing was written;
// roll back. When the effects live in
// MySQL, make this store the middleware's Store: it deduplicates by
// itself, with no Redis beside it.
var ErrForeignRun = errors.New("mysqlstore: the run was claimed in another store (this table has no record of its key): make this store the middleware's Config.Store")

// is reports whether st is this store: a run claimed in another Store of
// this package, on another table, is as foreign as one claimed in Redis.
func (s *Store) is(st idempotency.Store) bool { return st == idempotency.Store(s) }

// completeRun is CompleteInTx and CompleteValueInTx. A fence that fails
// for a run claimed in a store that is not recognisably this one (directly
// or through Unwrap) is ErrForeignRun when this table holds no record of
// the key: a run claimed here leaves its record for at least its TTL. A
// wrapper that does not unwrap still gets ErrLeaseLost for a lost lease,
// since the key's record is then in the table.
func (s *Store) completeRun(ctx context.Context, tx *sql.Tx, run *idempotency.Run, result []byte) error {
	err := s.CompleteTx(ctx, tx, run.Key(), run.Token(), result, run.CompletedTTL())
	if errors.Is(err, idempotency.ErrLeaseLost) && !run.ClaimedIn(s.is) {
		if rec, gerr := s.Get(ctx, run.Key()); gerr == nil && rec.State == idempotency.StateAbsent {
			return fmt.Errorf("%w (the run's store is a %T)", ErrForeignRun, run.Store())
		}
	}
	if err != nil {
		return err
	}
	run.CompletedInTransaction()
	return nil
}
