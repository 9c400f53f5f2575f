package pgstore

import (
	"context"
	"iter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// Columns is the column list every statement returns, for the alias r.
const Columns = columns

// SessionTimeoutParam is the setting ApplyPoolSettings sets.
const SessionTimeoutParam = sessionTimeoutParam

// The errors the store returns that no user needs to name.
var (
	ErrNilPool      = errNilPool
	ErrInvalidTable = sqlstore.ErrInvalidTable
	ErrInvalidBatch = sqlstore.ErrInvalidBatch
	ErrNoRun        = sqlstore.ErrNoRun
	ErrForeignRun   = sqlstore.ErrForeignRun
)

// ValidSQL is the record's invariant as an SQL condition on alias.
func ValidSQL(alias string) string { return valid(alias) }

// CheckScan scans extra then a record's Columns from row and returns what
// the store's decoding says of the record: nil for a well-formed one.
func CheckScan(src pgx.Row, extra ...any) (checkErr, scanErr error) {
	var r sqlstore.Row
	if err := src.Scan(append(extra, dest(&r)...)...); err != nil {
		return nil, err
	}
	return r.Check(), nil
}

// CompleteTx is the in-transaction completion of key by token, in q.
func (s *Store) CompleteTx(ctx context.Context, q Querier, key, token string, result []byte, ttl time.Duration) error {
	return s.completeTx(ctx, q, key, token, result, ttl)
}

// Purge deletes up to batch expired records: one round of PurgeEvery.
func (s *Store) Purge(ctx context.Context, batch int) (int64, error) {
	return s.d.Purge(ctx, batch)
}

// Schema is the DDL the store's Migrate runs.
func (s *Store) Schema() string { return s.sql.schema }

// RecordsBatch is Records with batch rows a page.
func (s *Store) RecordsBatch(ctx context.Context, prefix string, batch int) iter.Seq2[idempotency.Entry, error] {
	return s.d.Records(ctx, prefix, batch)
}
