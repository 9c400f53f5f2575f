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

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// ErrAlreadyCompleted is CompleteInTx's error when an earlier transaction
// of the same run committed its COMPLETED record: its COMMIT succeeded
// though the caller saw an error, and the work was tried again. Roll back:
// the effect is already in. It is the same value as
// pgstore.ErrAlreadyCompleted.
var ErrAlreadyCompleted = sqlstore.ErrAlreadyCompleted

// errNilTx is CompleteInTx's error for a nil transaction.
var errNilTx = errors.New("mysqlstore: nil *sql.Tx")

// CompleteInTx writes COMPLETED for the Watermill handler whose context is
// ctx (msg.Context()), inside tx, the transaction of the handler's effect.
// out, the messages the handler returns, is stored for replay. Call it
// last, right before the commit:
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
// The effect and COMPLETED commit together or not at all. On an error, roll
// back: it matches [idempotency.ErrLeaseLost] when another consumer took
// the key over, [ErrAlreadyCompleted] for a second transaction of the run,
// and names the mistake for a context of no run or a run claimed in another
// store (this store must be the middleware's Config.Store). The middleware
// writes no second COMPLETED: a failed commit must be the handler's error.
// docs/GUARANTEES.md tells what happens after a failed commit.
func (s *Store) CompleteInTx(ctx context.Context, tx *sql.Tx, out ...*message.Message) error {
	return s.completeRun(ctx, tx, func(run *storekit.Run) []byte { return run.Result(out...) })
}

// CompleteValueInTx is [Store.CompleteInTx] for the work of
// [idempotency.Once.Do]: value is the result replayed to later callers.
func (s *Store) CompleteValueInTx(ctx context.Context, tx *sql.Tx, value []byte) error {
	return s.completeRun(ctx, tx, func(*storekit.Run) []byte { return value })
}

func (s *Store) completeRun(ctx context.Context, tx *sql.Tx, result func(*storekit.Run) []byte) error {
	err := sqlstore.CompleteInTx(ctx, s, result, func(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
		return s.completeTx(ctx, tx, key, token, result, ttl)
	})
	if errors.Is(err, sqlstore.ErrNoRun) || errors.Is(err, sqlstore.ErrForeignRun) {
		return fmt.Errorf("mysqlstore: %w", err)
	}
	return err
}

// completeTx is Complete run in tx, the transaction of the effect. The
// fence is stricter than Complete's: ErrLeaseLost unless token holds a
// lease that has not lapsed, and ErrAlreadyCompleted when token's own
// COMPLETED was committed before. Once applied, the row stays locked (an
// exclusive record lock) until the transaction ends, so no claim can take
// the key over in between; a claim of the key waits for the commit and then
// finds it COMPLETED.
//
// It is one UPDATE, a locking read in InnoDB: at every isolation level it
// judges the fence on the latest committed version of the row, never on
// the transaction's snapshot. Under REPEATABLE READ with MariaDB's
// innodb_snapshot_isolation=ON (MariaDB 11.8's default), a row changed since
// the transaction's snapshot (the owner's own renewals do that) makes it
// fail with error 1020 "Record has changed since last read".
func (s *Store) completeTx(ctx context.Context, tx *sql.Tx, key, token string, result []byte, ttl time.Duration) error {
	if tx == nil {
		return wrap(sqlstore.OpCompleteTx, key, errNilTx)
	}
	err := s.complete(ctx, txRunner{s: s, tx: tx}, sqlstore.OpCompleteTx, key, token, result, ttl)
	if err != nil && (errors.Is(err, idempotency.ErrLeaseLost) || isNoSuchTable(err)) && !strings.Contains(s.table, ".") {
		// The fence found no row of ours, or no table: the transaction may
		// be on another database, which has no such table or one of its
		// own, not this store's.
		if txDB, storeDB, ok := s.databases(ctx, tx); ok && txDB != storeDB {
			return wrap(sqlstore.OpCompleteTx, key, fmt.Errorf("%w: the transaction is on database %q, the table %s on %q", errOtherDatabase, txDB, s.table, storeDB))
		}
	}
	return err
}

// errOtherDatabase is completeTx's error for a transaction on another
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
// completeTx (OpCompleteTx: it does not).
func (s *Store) complete(ctx context.Context, q runner, op, key, token string, result []byte, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap(op, key, err)
	}
	if result == nil {
		result = []byte{} // NULL is the absence of a result; an empty one is a value
	}
	return s.owned(ctx, q, op, key, token, s.sql.complete, result, durationMicros(ttl))
}
