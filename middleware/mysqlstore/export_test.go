package mysqlstore

import (
	"context"
	"database/sql"
	"iter"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// TableOf returns the store's table as configured.
func TableOf(s *Store) string { return s.table }

// The errors the store returns that no user needs to name.
var (
	ErrNilDB        = errNilDB
	ErrNilTx        = errNilTx
	ErrTooLong      = errTooLong
	ErrInvalidTable = sqlstore.ErrInvalidTable
	ErrInvalidBatch = sqlstore.ErrInvalidBatch
	ErrNoRun        = sqlstore.ErrNoRun
	ErrForeignRun   = sqlstore.ErrForeignRun
)

// The bounds of the bounded columns.
const (
	MaxTokenBytes       = maxTokenBytes
	MaxFingerprintBytes = maxFingerprintBytes
)

// CompleteTx is the in-transaction completion of key by token, in tx.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, key, token string, result []byte, ttl time.Duration) error {
	return s.completeTx(ctx, tx, key, token, result, ttl)
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
