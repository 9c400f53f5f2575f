package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// Records and DeleteIf serve an operator's tool (cmd/idemctl), not messages.

// logicalState is the state a row reads as: a lapsed lease is failed.
const logicalState = `(CASE WHEN r.state = 'in_progress' AND r.lease_until <= UTC_TIMESTAMP(6) THEN 'failed' ELSE r.state END)`

// rowBytes is the size of r's values; a corrupt row's NULLs count as empty.
const rowBytes = "(32 + COALESCE(LENGTH(r.`key`), 0) + COALESCE(LENGTH(r.state), 0) + COALESCE(LENGTH(r.token), 0)" +
	" + COALESCE(LENGTH(r.fingerprint), 0) + COALESCE(LENGTH(r.result), 0) + 2*8 + 4*8)"

// prefixSQL: the key starts with the parameter's bytes (given twice).
const prefixSQL = "LEFT(r.`key`, LENGTH(?)) = ?"

type inspectStatements struct{ page, lock, del string }

func (s *Store) inspectSQL() inspectStatements {
	r := strings.NewReplacer("{t}", quoteTable(s.table), "{columns}", columns, "{valid_r}", valid("r."),
		"{state}", logicalState, "{prefix}", prefixSQL, "{bytes}", rowBytes)
	return inspectStatements{
		// Keyset pagination on the primary key; expired rows are left out unless corrupt.
		page: r.Replace("SELECT r.key_hash, r.`key`, {bytes}, {columns} FROM {t} AS r" + `
	WHERE r.key_hash > ? AND {prefix}
	AND (NOT {valid_r} OR r.expires_at > UTC_TIMESTAMP(6))
	ORDER BY r.key_hash LIMIT ?`),
		lock: r.Replace(`SELECT {valid_r}, r.expires_at <= UTC_TIMESTAMP(6), {state} FROM {t} AS r WHERE r.key_hash = ? FOR UPDATE`),
		del:  r.Replace(`DELETE FROM {t} WHERE key_hash = ?`),
	}
}

// Records yields the live records whose key starts with prefix, by pages
// of 500 without a lock across pages; Entry.Bytes sums the column lengths.
// A corrupt row has Entry.Err; a failed query ends the walk.
func (s *Store) Records(ctx context.Context, prefix string) iter.Seq2[idempotency.Entry, error] {
	return s.d.Records(ctx, prefix, sqlstore.PageSize)
}

// DeleteIf deletes key's row only when its record is in one of states (a
// lapsed lease is StateFailed), in one READ COMMITTED transaction, and
// reports the state found. A corrupt row is ErrCorruptRecord and stays.
func (s *Store) DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error) {
	names, err := sqlstore.StateNames(key, states)
	if err != nil {
		return 0, false, wrap("delete if", key, err)
	}
	hash := sqlstore.KeyHash(key)
	stmts := s.inspectSQL()
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	defer func() { _ = tx.Rollback() }()
	// A corrupt row may have NULLs where a record has none.
	var isValid bool
	var expiredOrNull sql.NullBool
	var stateOrNull sql.NullString
	err = tx.QueryRowContext(ctx, stmts.lock, hash).Scan(&isValid, &expiredOrNull, &stateOrNull)
	expired, state := expiredOrNull.Bool, stateOrNull.String
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idempotency.StateAbsent, false, nil
	case err != nil:
		return 0, false, s.queryError(ctx, "delete if", key, err)
	case !isValid:
		// Get names what is wrong with it.
		if _, err := s.Get(ctx, key); err != nil {
			return 0, false, err
		}
		return 0, false, wrap("delete if", key, fmt.Errorf("%w: %w", idempotency.ErrCorruptRecord, sqlstore.ErrMalformed))
	case expired:
		return idempotency.StateAbsent, false, nil
	case !slices.Contains(names, state):
		return sqlstore.StateOf(state), false, nil
	}
	if _, err := tx.ExecContext(ctx, stmts.del, hash); err != nil {
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	return sqlstore.StateOf(state), true, nil
}
