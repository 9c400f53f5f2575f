package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// Querier runs one statement and returns its first row: the transaction
// of [Store.CompleteInTx]. pgx.Tx satisfies it. A database/sql transaction
// on pgx's stdlib driver fits through a one-method adapter:
//
//	type sqlTx struct{ *sql.Tx }
//
//	func (t sqlTx) QueryRow(ctx context.Context, q string, args ...any) pgx.Row {
//		return t.QueryRowContext(ctx, q, args...)
//	}
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrAlreadyCompleted is CompleteInTx's error when an earlier transaction
// of the same run committed its COMPLETED record: its COMMIT succeeded
// though the caller saw an error, and the work was tried again. Roll back:
// the effect is already in. It is the same value as
// mysqlstore.ErrAlreadyCompleted.
var ErrAlreadyCompleted = sqlstore.ErrAlreadyCompleted

// CompleteInTx writes COMPLETED for the Watermill handler whose context is
// ctx (msg.Context()), inside tx, the transaction of the handler's effect.
// out, the messages the handler returns, is stored for replay. Call it
// last, right before the commit:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO ledger …", …); err != nil {
//			return err
//		}
//		return store.CompleteInTx(ctx, tx, out...)
//	})
//	return out, err
//
// The effect and COMPLETED commit together or not at all. On an error, roll
// back: it matches [idempotency.ErrLeaseLost] when another consumer took
// the key over, [ErrAlreadyCompleted] for a second transaction of the run,
// and names the mistake for a context of no run or a run claimed in another
// store (this store must be the middleware's Config.Store). The middleware
// writes no second COMPLETED: a failed commit must be the handler's error.
// docs/GUARANTEES.md tells what happens after a failed commit.
func (s *Store) CompleteInTx(ctx context.Context, tx Querier, out ...*message.Message) error {
	return s.completeRun(ctx, tx, func(run *storekit.Run) []byte { return run.Result(out...) })
}

// CompleteValueInTx is [Store.CompleteInTx] for the work of
// [idempotency.Once.Do]: value is the result replayed to later callers.
func (s *Store) CompleteValueInTx(ctx context.Context, tx Querier, value []byte) error {
	return s.completeRun(ctx, tx, func(*storekit.Run) []byte { return value })
}

func (s *Store) completeRun(ctx context.Context, tx Querier, result func(*storekit.Run) []byte) error {
	err := sqlstore.CompleteInTx(ctx, s, result, func(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
		return s.completeTx(ctx, tx, key, token, result, ttl)
	})
	if errors.Is(err, sqlstore.ErrNoRun) || errors.Is(err, sqlstore.ErrForeignRun) {
		return fmt.Errorf("pgstore: %w", err)
	}
	return err
}

// completeTx is Complete run by q, the transaction of the effect. The
// fence is stricter than Complete's: ErrLeaseLost unless token holds a
// lease that has not lapsed, and ErrAlreadyCompleted when token's own
// COMPLETED was committed before. Once applied, the row stays locked until
// the transaction ends, so no claim can take the key over in between; a
// claim of the key waits for the commit and then finds it COMPLETED. Under
// REPEATABLE READ or SERIALIZABLE, the fence reads the row of the
// transaction's snapshot: a change of the row since the snapshot is a
// serialization failure (SQLSTATE 40001), returned as it is, and a
// transaction that outlived the lease its snapshot shows gets ErrLeaseLost.
func (s *Store) completeTx(ctx context.Context, q Querier, key, token string, result []byte, ttl time.Duration) error {
	err := s.complete(ctx, q, sqlstore.OpCompleteTx, key, token, result, ttl)
	if errors.Is(err, idempotency.ErrLeaseLost) {
		// The fence found no row of ours: q may be on another database
		// (or search_path), with a table of the same name of its own.
		if qt, st, ok := s.tables(ctx, q); ok && qt != st {
			return wrap(sqlstore.OpCompleteTx, key, fmt.Errorf("%w: the transaction's %s is %s, the store's %s", errOtherTable, s.table, qt, st))
		}
	}
	return err
}

// errOtherTable is completeTx's error for a transaction that does not
// reach the store's table.
var errOtherTable = errors.New("pgstore: the transaction does not reach the store's table (another database, or search_path): begin it on a pool of the store's database")

// tables names the table that s.table is, as q and as the store's pool
// see it: its database and OID.
func (s *Store) tables(ctx context.Context, q Querier) (qTable, storeTable string, ok bool) {
	const which = "SELECT current_database() || ' ' || coalesce(to_regclass($1)::oid::text, 'none')"
	name := pgx.Identifier(strings.Split(s.table, ".")).Sanitize()
	if q.QueryRow(ctx, which, name).Scan(&qTable) != nil || s.pool.QueryRow(ctx, which, name).Scan(&storeTable) != nil {
		return "", "", false
	}
	return qTable, storeTable, true
}

// complete is Complete (op "complete": a resend by the owner succeeds) and
// completeTx (OpCompleteTx: it does not).
func (s *Store) complete(ctx context.Context, q Querier, op, key, token string, result []byte, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap(op, key, err)
	}
	if result == nil {
		result = []byte{} // NULL is the absence of a result; an empty one is a value
	}
	return s.owned(ctx, q, op, key, token, s.sql.complete, result, micros(ttl))
}
