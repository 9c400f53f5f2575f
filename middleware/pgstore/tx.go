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

// Querier runs one statement and returns its first row: pgx.Tx, or a
// database/sql transaction on pgx's stdlib driver through an adapter:
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
// of the run committed COMPLETED though the caller saw an error. Roll back:
// the effect is in. It is mysqlstore.ErrAlreadyCompleted.
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
// and names the mistake for a context of no run or of another store. A
// failed commit must be the handler's error. See docs/GUARANTEES.md.
func (s *Store) CompleteInTx(ctx context.Context, tx Querier, out ...*message.Message) error {
	return s.completeRun(ctx, tx, func(run *storekit.Run) []byte { return run.Result(out...) })
}

// CompleteValueInTx is [Store.CompleteInTx] for the work of
// [idempotency.Once.Do]: value is the result replayed to later callers.
func (s *Store) CompleteValueInTx(ctx context.Context, tx Querier, value []byte) error {
	return s.completeRun(ctx, tx, func(*storekit.Run) []byte { return value })
}

func (s *Store) completeRun(ctx context.Context, tx Querier, result func(*storekit.Run) []byte) error {
	return sqlstore.CompleteInTx(ctx, "pgstore", s, result, func(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
		return s.completeTx(ctx, tx, key, token, result, ttl)
	})
}

// completeTx is Complete in q, with a stricter fence: ErrLeaseLost unless
// token holds a live lease, ErrAlreadyCompleted after its own committed
// COMPLETED. The row stays locked until the transaction ends. Under
// REPEATABLE READ or SERIALIZABLE the fence reads the snapshot: a row
// changed since is SQLSTATE 40001, and a lease lapsed in it ErrLeaseLost.
func (s *Store) completeTx(ctx context.Context, q Querier, key, token string, result []byte, ttl time.Duration) error {
	err := s.complete(ctx, q, sqlstore.OpCompleteTx, key, token, result, ttl)
	if errors.Is(err, idempotency.ErrLeaseLost) {
		// No row of ours: q may reach another table of that name.
		if qt, st, ok := s.tables(ctx, q); ok && qt != st {
			return wrap(sqlstore.OpCompleteTx, key, fmt.Errorf("%w: the transaction's %s is %s, the store's %s", errOtherTable, s.table, qt, st))
		}
	}
	return err
}

var errOtherTable = errors.New("pgstore: the transaction does not reach the store's table (another database, or search_path): begin it on a pool of the store's database")

// tables names s.table's database and OID as q and as the pool see it.
func (s *Store) tables(ctx context.Context, q Querier) (qTable, storeTable string, ok bool) {
	const which = "SELECT current_database() || ' ' || coalesce(to_regclass($1)::oid::text, 'none')"
	name := pgx.Identifier(strings.Split(s.table, ".")).Sanitize()
	if q.QueryRow(ctx, which, name).Scan(&qTable) != nil || s.pool.QueryRow(ctx, which, name).Scan(&storeTable) != nil {
		return "", "", false
	}
	return qTable, storeTable, true
}

// complete is Complete (op "complete": an owner's resend succeeds) and
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
