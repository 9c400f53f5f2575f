package pgstore

import (
	"context"
	"errors"
	"iter"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// Records and DeleteIf serve an operator's tool (cmd/idemctl), not messages.

// logicalState is the state a row reads as: a lapsed lease is failed.
const logicalState = `(CASE WHEN r.state = 'in_progress' AND r.lease_until <= statement_timestamp() THEN 'failed' ELSE r.state END)`

// inspectStatements are the operator's statements for the store's table.
type inspectStatements struct{ page, deleteIf string }

func (s *Store) inspectSQL() inspectStatements {
	t := pgx.Identifier(strings.Split(s.table, ".")).Sanitize() // validated by New
	r := strings.NewReplacer("{t}", t, "{columns}", columns, "{valid_r}", valid("r"), "{state}", logicalState)
	return inspectStatements{
		// Keyset pagination on the primary key; expired rows are left out unless corrupt.
		page: r.Replace(`SELECT r.key_hash, r.key, pg_column_size(r.*), {columns} FROM {t} AS r
	WHERE r.key_hash > $1 AND substring(r.key from 1 for octet_length($2::bytea)) = $2::bytea
	AND (NOT {valid_r} OR r.expires_at > statement_timestamp())
	ORDER BY r.key_hash LIMIT $3`),
		deleteIf: r.Replace(`DELETE FROM {t} AS r WHERE r.key_hash = $1 AND {valid_r}
	AND r.expires_at > statement_timestamp() AND {state} = ANY($2::text[])
	RETURNING {state}`),
	}
}

// Records yields the live records whose key starts with prefix, in
// key_hash order, by pages of 500 rows without a lock across pages.
// Entry.Bytes is pg_column_size. A corrupt row has Entry.Err; a failed
// query is the iterator's error and ends the walk.
func (s *Store) Records(ctx context.Context, prefix string) iter.Seq2[idempotency.Entry, error] {
	return s.d.Records(ctx, prefix, sqlstore.PageSize)
}

// DeleteIf deletes key's row in one statement only when its record is in
// one of states (a lapsed lease is StateFailed), and reports the state
// found: StateAbsent for none. The owner then gets ErrLeaseLost. A corrupt
// row is ErrCorruptRecord and stays: Delete removes it. When nothing was
// deleted, a second read reports the state, maybe newer.
func (s *Store) DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error) {
	names, err := sqlstore.StateNames(key, states)
	if err != nil {
		return 0, false, wrap("delete if", key, err)
	}
	var state string
	err = s.pool.QueryRow(ctx, s.inspectSQL().deleteIf, sqlstore.KeyHash(key), names).Scan(&state)
	switch {
	case err == nil:
		return sqlstore.StateOf(state), true, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil {
		return 0, false, err
	}
	return rec.State, false, nil
}
