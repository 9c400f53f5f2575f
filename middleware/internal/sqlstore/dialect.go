package sqlstore

import (
	"context"
	"iter"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Dialect is what a SQL store gives the shared code: its name, its table,
// its statements and its driver glue. The methods are the store's
// operations that read the same in every dialect.
type Dialect struct {
	Pkg   string // "pgstore", for errors
	Table string // as configured, for errors
	// GetSQL reads a key's record: the key's hash as its one parameter.
	// DeleteSQL deletes any row of the key's hash.
	GetSQL, DeleteSQL string
	// DeleteExpired deletes up to batch expired rows and returns how many.
	DeleteExpired func(ctx context.Context, batch int) (int64, error)
	// PageSQL reads a page of Records: PageArgs gives its parameters.
	PageSQL  string
	PageArgs func(after []byte, prefix string, batch int) []any
	// Dest gives the scan destinations of a record's columns.
	Dest func(r *Row) []any
	// QueryRow runs a statement for one row on the pool; a missing row is
	// an error that IsNoRows tells.
	QueryRow func(ctx context.Context, query string, args ...any) interface{ Scan(dest ...any) error }
	IsNoRows func(err error) bool
	// Exec runs a statement on the pool and returns the rows it changed.
	Exec func(ctx context.Context, query string, args ...any) (int64, error)
	// Query runs a statement on the pool, and returns its rows and how to
	// close them.
	Query func(ctx context.Context, query string, args ...any) (Rows, func(), error)
	// QueryError translates an error of the driver for op on key.
	QueryError func(ctx context.Context, op, key string, err error) error
}

// Wrap is err for op on key, named after the store.
func (d *Dialect) Wrap(op, key string, err error) error { return Wrap(d.Pkg, op, key, err) }

// Get is the stores' Get: one statement.
func (d *Dialect) Get(ctx context.Context, key string) (idempotency.Record, error) {
	if err := CheckKey(ctx, key); err != nil {
		return idempotency.Record{}, d.Wrap("get", key, err)
	}
	var r Row
	err := d.QueryRow(ctx, d.GetSQL, KeyHash(key)).Scan(d.Dest(&r)...)
	if err != nil && !d.IsNoRows(err) {
		return idempotency.Record{}, d.QueryError(ctx, "get", key, err)
	}
	rec, err := r.Read(err == nil)
	if err != nil {
		return rec, d.Wrap("get", key, err)
	}
	return rec, nil
}

// Delete is the stores' Delete: one statement, which removes any row, a
// corrupt one included.
func (d *Dialect) Delete(ctx context.Context, key string) error {
	if err := CheckKey(ctx, key); err != nil {
		return d.Wrap("delete", key, err)
	}
	if _, err := d.Exec(ctx, d.DeleteSQL, KeyHash(key)); err != nil {
		return d.QueryError(ctx, "delete", key, err)
	}
	return nil
}

// Purge is one purge of up to batch expired rows.
func (d *Dialect) Purge(ctx context.Context, batch int) (int64, error) {
	return Purge(ctx, d.Pkg, d.Table, batch, d.DeleteExpired)
}

// Records is the stores' Records with batch rows a page.
func (d *Dialect) Records(ctx context.Context, prefix string, batch int) iter.Seq2[idempotency.Entry, error] {
	return Records(batch, d.Dest, func(after []byte) (Rows, func(), error) {
		return d.Query(ctx, d.PageSQL, d.PageArgs(after, prefix, batch)...)
	}, func(key string, err error) error { return d.Wrap("records", key, err) },
		func(err error) error { return d.QueryError(ctx, "records", prefix, err) })
}

// PurgeEvery is the stores' PurgeEvery (see the function PurgeEvery).
func (d *Dialect) PurgeEvery(ctx context.Context, interval time.Duration, batch int, logger watermill.LoggerAdapter) error {
	return PurgeEvery(ctx, d.Pkg, d.Table, interval, batch, d.DeleteExpired, logger)
}
