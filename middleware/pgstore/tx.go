package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Querier runs one statement and returns its first row. pgx.Tx, *pgx.Conn,
// *pgxpool.Conn and *pgxpool.Pool satisfy it; CompleteTx takes one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CompleteTx is Complete run by q, typically the pgx.Tx in which the handler
// made its effect: the effect and the COMPLETED record then commit together,
// or not at all. The fence is Complete's, but stricter: it returns
// idempotency.ErrLeaseLost unless token holds a lease that has not lapsed,
// and ErrAlreadyCompleted when token's own COMPLETED was committed before;
// in both cases the transaction must roll back, effect included. Once applied, the row stays locked until the
// transaction ends, so no claim can take the key over in between; a claim of
// the key waits for the commit and then finds it COMPLETED. Under REPEATABLE
// READ or SERIALIZABLE, the fence reads the row of the transaction's
// snapshot: a change of the row since the snapshot is a serialization
// failure (SQLSTATE 40001), returned as it is, and a transaction that
// outlived the lease its snapshot shows gets ErrLeaseLost; either way, roll
// back and let the message be redelivered.
func (s *Store) CompleteTx(ctx context.Context, q Querier, key, token string, result []byte, ttl time.Duration) error {
	err := s.complete(ctx, q, opCompleteTx, key, token, result, ttl)
	if errors.Is(err, idempotency.ErrLeaseLost) {
		// The fence found no row of ours: q may be on another database
		// (or search_path), with a table of the same name of its own.
		if qt, st, ok := s.tables(ctx, q); ok && qt != st {
			return wrap(opCompleteTx, key, fmt.Errorf("%w: the transaction's %s is %s, the store's %s", errOtherTable, s.table, qt, st))
		}
	}
	return err
}

// errOtherTable is CompleteTx's error for a transaction that does not
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
// CompleteTx (opCompleteTx: it does not).
func (s *Store) complete(ctx context.Context, q Querier, op, key, token string, result []byte, ttl time.Duration) error {
	if err := idempotency.CheckOwner(key, token, ttl); err != nil {
		return wrap(op, key, err)
	}
	if result == nil {
		result = []byte{} // NULL is the absence of a result; an empty one is a value
	}
	return s.owned(ctx, q, op, key, token, s.sql.complete, result, micros(ttl))
}

// opCompleteTx names CompleteTx in errors and tells owned that a COMPLETED
// record of the same token is not a resend.
const opCompleteTx = "complete in transaction"

// ErrAlreadyCompleted is returned by CompleteTx, CompleteInTx and
// CompleteValueInTx when the run's own COMPLETED record was committed
// before, by an earlier transaction of the same run: its COMMIT succeeded
// though the caller saw an error, and the work was tried again (Watermill's
// Retry inside this middleware, say). Roll the transaction back: its effect
// is already in the database. Unlike Complete, which a client resends with
// nothing else in it, a transaction that completes carries an effect, and
// committing it twice would double the effect.
var ErrAlreadyCompleted = errors.New("pgstore: the run already committed its COMPLETED record and its effect")

// SQLTx adapts a database/sql transaction to Querier, for CompleteTx. The
// *sql.DB must use a PostgreSQL driver that takes $1 placeholders and maps
// []byte to bytea: pgx's own (github.com/jackc/pgx/v5/stdlib, driver name
// "pgx") does.
func SQLTx(tx *sql.Tx) Querier { return sqlTx{tx} }

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return t.tx.QueryRowContext(ctx, query, args...) // *sql.Row has pgx.Row's Scan
}

// ErrNoRun is returned by CompleteInTx and CompleteValueInTx for a context
// that belongs to no run of the idempotency middleware or of Once.Do.
var ErrNoRun = errors.New("pgstore: the context belongs to no idempotent run (use the handler's msg.Context() or Do's work context)")

// CompleteInTx writes COMPLETED for the Watermill handler whose context ctx
// is (msg.Context()), inside tx, the transaction that made the handler's
// effect, with the messages the handler will return as the stored output
// (replayed for duplicates, as the middleware stores it). Call it last,
// right before committing tx:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO ledger …", …); err != nil {
//			return err
//		}
//		return store.CompleteInTx(ctx, tx, out...)
//	})
//	return out, err
//
// The effect and COMPLETED then commit together or not at all. If the
// lease was lost (another consumer took the key over), it returns an error
// matching idempotency.ErrLeaseLost and the transaction must roll back,
// effect included; so it does when a renewal found the loss first and
// cancelled ctx (the error then matches context.Canceled as well). A run
// claimed in another store (the middleware's Store is Redis, say) gets
// ErrForeignRun, and nothing is written: this store must be the
// middleware's Store. Once it succeeded, the run keeps renewing its lease
// until a renewal finds the transaction committed (the key COMPLETED under
// the run's token: the lease then ends quietly) or rolled back (the lease
// goes on), so that a failed COMMIT followed by a retry never runs beside
// another consumer's copy; see the package doc. The middleware does not
// write COMPLETED again after a success; the handler must return an error
// when the commit fails. tx may be a pgx.Tx, or SQLTx of a *sql.Tx.
func (s *Store) CompleteInTx(ctx context.Context, tx Querier, out ...*message.Message) error {
	run, ok := idempotency.RunFromContext(ctx)
	if !ok {
		return ErrNoRun
	}
	return s.completeRun(ctx, tx, run, run.Result(out...))
}

// CompleteValueInTx is CompleteInTx for the work of Once.Do: value, what the
// work returns, is stored as its result and replayed to later callers.
func (s *Store) CompleteValueInTx(ctx context.Context, tx Querier, value []byte) error {
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
// PostgreSQL, make this store the middleware's Store: it deduplicates by
// itself, with no Redis beside it.
var ErrForeignRun = errors.New("pgstore: the run was claimed in another store (this table has no record of its key): make this store the middleware's Config.Store")

// is reports whether st is this store: a run claimed in another Store of
// this package, on another table, is as foreign as one claimed in Redis.
func (s *Store) is(st idempotency.Store) bool { return st == idempotency.Store(s) }

// completeRun is CompleteInTx and CompleteValueInTx. A fence that fails
// for a run claimed in a store that is not recognisably this one (directly
// or through Unwrap) is ErrForeignRun when this table holds no record of
// the key: a run claimed here leaves its record for at least its TTL. A
// wrapper that does not unwrap still gets ErrLeaseLost for a lost lease,
// since the key's record is then in the table.
func (s *Store) completeRun(ctx context.Context, tx Querier, run *idempotency.Run, result []byte) error {
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
