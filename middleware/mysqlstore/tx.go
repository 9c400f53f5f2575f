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

// ErrAlreadyCompleted is CompleteInTx's error after an earlier transaction
// of the run committed. Roll back: the effect is in. It is pgstore's too.
var ErrAlreadyCompleted = sqlstore.ErrAlreadyCompleted

var errNilTx = errors.New("mysqlstore: nil *sql.Tx")

// CompleteInTx writes COMPLETED, with out for replay, for the Watermill
// handler whose context is ctx (msg.Context()), inside tx, the transaction
// of its effect. Call it last, right before the commit:
//
//	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
//	…
//	defer tx.Rollback()
//	_, err = tx.ExecContext(ctx, "INSERT INTO ledger …", …)
//	…
//	if err := store.CompleteInTx(ctx, tx, out...); err != nil {
//		return nil, err
//	}
//	return out, tx.Commit()
//
// On an error, roll back: it matches [idempotency.ErrLeaseLost] when another
// consumer took the key over, [ErrAlreadyCompleted] for a second
// transaction of the run, and names a context of no run or of another store.
func (s *Store) CompleteInTx(ctx context.Context, tx *sql.Tx, out ...*message.Message) error {
	return s.completeRun(ctx, tx, func(run *storekit.Run) []byte { return run.Result(out...) })
}

// CompleteValueInTx is [Store.CompleteInTx] for [idempotency.Once.Do]'s value.
func (s *Store) CompleteValueInTx(ctx context.Context, tx *sql.Tx, value []byte) error {
	return s.completeRun(ctx, tx, func(*storekit.Run) []byte { return value })
}

func (s *Store) completeRun(ctx context.Context, tx *sql.Tx, result func(*storekit.Run) []byte) error {
	return sqlstore.CompleteInTx(ctx, "mysqlstore", s, result, func(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
		return s.completeTx(ctx, tx, key, token, result, ttl)
	})
}

// completeTx is Complete in tx, with a stricter fence (no resend). The row
// stays locked until the transaction ends. MariaDB's REPEATABLE READ with
// innodb_snapshot_isolation=ON fails on a row renewed since (error 1020).
func (s *Store) completeTx(ctx context.Context, tx *sql.Tx, key, token string, result []byte, ttl time.Duration) error {
	if tx == nil {
		return wrap(sqlstore.OpCompleteTx, key, errNilTx)
	}
	err := s.complete(ctx, txRunner{s: s, tx: tx}, sqlstore.OpCompleteTx, key, token, result, ttl)
	if err != nil && (errors.Is(err, idempotency.ErrLeaseLost) || isNoSuchTable(err)) && !strings.Contains(s.table, ".") {
		// No row of ours, or no table: tx may be on another database.
		if txDB, storeDB, ok := s.databases(ctx, tx); ok && txDB != storeDB {
			return wrap(sqlstore.OpCompleteTx, key, fmt.Errorf("%w: the transaction is on database %q, the table %s on %q", errOtherDatabase, txDB, s.table, storeDB))
		}
	}
	return err
}

var errOtherDatabase = errors.New("mysqlstore: the transaction is not on the store's database: begin it on a pool of that database, or qualify Config.Table with it")

func (s *Store) databases(ctx context.Context, tx *sql.Tx) (txDB, storeDB string, ok bool) {
	var a, b sql.NullString
	if tx.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&a) != nil || s.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&b) != nil {
		return "", "", false
	}
	return a.String, b.String, true
}

// complete is Complete and completeTx (OpCompleteTx: a resend fails).
func (s *Store) complete(ctx context.Context, q runner, op, key, token string, result []byte, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap(op, key, err)
	}
	if result == nil {
		result = []byte{} // NULL is the absence of a result; an empty one is a value
	}
	return s.owned(ctx, q, op, key, token, s.sql.complete, result, durationMicros(ttl))
}
