package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

var errNilPool = errors.New("pgstore: nil pgx pool")

const indexSuffix = "_expires_at"

// maxIdentifier is NAMEDATALEN-1: the server would truncate longer names,
// and two index names could collide.
const maxIdentifier = 63

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table holds the records: lower-case ASCII letters, digits and
	// underscores, not starting with a digit, at most 52 bytes, optionally
	// qualified by a schema ("idempotency.keys"). The default is
	// idempotency_keys, through the connection's search_path.
	Table string
}

// Schema returns the DDL that [Store.Migrate] runs, for your own migrations.
func Schema(cfg Config) (string, error) {
	_, parts, err := sqlstore.ParseTable("pgstore", cfg.Table, maxIdentifier, indexSuffix)
	return statementsFor(parts).schema, err
}

func statementsFor(parts []string) statements {
	if parts == nil {
		return statements{}
	}
	return buildStatements(pgx.Identifier(parts).Sanitize(), pgx.Identifier{parts[len(parts)-1] + indexSuffix}.Sanitize())
}

// Store is an [idempotency.Store] on a PostgreSQL table, safe for
// concurrent use. It does not own the pool.
type Store struct {
	pool  *pgxpool.Pool
	table string // as configured, for messages
	sql   statements
	d     sqlstore.Dialect
}

var _ idempotency.Store = (*Store)(nil)

// New returns a store on pool. It does not contact the server: create the
// table with [Store.Migrate] or [Schema].
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errNilPool
	}
	table, parts, err := sqlstore.ParseTable("pgstore", cfg.Table, maxIdentifier, indexSuffix)
	if err != nil {
		return nil, err
	}
	st := statementsFor(parts)
	s := &Store{pool: pool, table: table, sql: st}
	s.d = sqlstore.Dialect{Pkg: "pgstore", Table: table,
		GetSQL: st.get, DeleteSQL: st.del, PageSQL: s.inspectSQL().page,
		PageArgs: func(after []byte, prefix string, batch int) []any { return []any{after, []byte(prefix), batch} },
		Dest:     dest,
		QueryRow: func(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
			return pool.QueryRow(ctx, q, args...)
		},
		IsNoRows: func(err error) bool { return errors.Is(err, pgx.ErrNoRows) },
		Exec: func(ctx context.Context, q string, args ...any) (int64, error) {
			tag, err := pool.Exec(ctx, q, args...)
			return tag.RowsAffected(), err
		},
		Query: func(ctx context.Context, q string, args ...any) (sqlstore.Rows, func(), error) {
			rows, err := pool.Query(ctx, q, args...)
			if err != nil {
				return nil, nil, err
			}
			return rows, rows.Close, nil
		},
		QueryError: s.queryError,
	}
	s.d.DeleteExpired = func(ctx context.Context, batch int) (int64, error) { return s.d.Exec(ctx, st.purge, batch) }
	return s, nil
}

// Migrate creates the table and index unless they exist, under an advisory
// lock on the table's name, so it is safe from any number of processes at
// once. It never alters a table. It fails when another relation has the
// index's name (a table named <table>_expires_at).
func (s *Store) Migrate(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Two CREATE TABLE IF NOT EXISTS at once may fail on a catalog key.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "pgstore.migrate:"+s.table); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.schema); err != nil {
			return err
		}
		// CREATE INDEX IF NOT EXISTS skips when any relation has the index's name.
		parts := strings.Split(s.table, ".")
		index := parts[len(parts)-1] + indexSuffix
		var indexed bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			WHERE i.indrelid = to_regclass($1) AND c.relname = $2)`, pgx.Identifier(parts).Sanitize(), index).Scan(&indexed); err != nil {
			return err
		}
		if !indexed {
			return fmt.Errorf("%q, the name of the table's expiry index, is another relation's: rename that one", index)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", s.table, err)
	}
	return nil
}

// Claim implements idempotency.Store with one statement: an INSERT … ON
// CONFLICT DO UPDATE, unless the key is a COMPLETED duplicate.
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := storekit.CheckClaim(key, req.Token, req.Lease, req.TTL); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	var fp []byte
	if len(req.Fingerprint) > 0 {
		fp = req.Fingerprint
	}
	var r sqlstore.Row
	err := s.pool.QueryRow(ctx, s.sql.claim, sqlstore.KeyHash(key), []byte(key), []byte(req.Token),
		micros(req.Lease), micros(req.TTL), fp).Scan(dest(&r)...)
	if err != nil {
		return idempotency.ClaimResult{}, s.queryError(ctx, "claim", key, err)
	}
	if err := r.Check(); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	if r.Expired() {
		// The statement overwrites an expired valid row: this one it misread.
		return idempotency.ClaimResult{}, wrap("claim", key, fmt.Errorf("%w: the claim returned an expired record", idempotency.ErrCorruptRecord))
	}
	// Acquired iff the row is the token's live lease, unless the
	// fingerprints differ: that refusal keeps a resend's row as it was.
	refusedFP := len(fp) > 0 && len(r.Fingerprint) > 0 && string(fp) != string(r.Fingerprint)
	if r.Holds(req.Token) && !refusedFP {
		return idempotency.ClaimResult{Acquired: true, Record: r.Record(true)}, nil
	}
	return idempotency.ClaimResult{Record: r.Record(false)}, nil
}

// Renew implements idempotency.Store with one UPDATE. Its
// idempotency.ErrCompletedByOwner tells a run its CompleteInTx committed.
// When the UPDATE refused a row its snapshot shows as the token's, it runs again.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	if err := storekit.CheckOwner(key, token, lease); err != nil {
		return wrap("renew", key, err)
	}
	err := s.owned(ctx, s.pool, "renew", key, token, s.sql.renew, micros(lease))
	if errors.Is(err, sqlstore.ErrRenewRaced) {
		err = s.owned(ctx, s.pool, "renew", key, token, s.sql.renew, micros(lease))
		if errors.Is(err, sqlstore.ErrRenewRaced) {
			// Changed under it twice: the token does not hold it now.
			err = wrap("renew", key, idempotency.ErrLeaseLost)
		}
	}
	return err
}

// Complete implements idempotency.Store with one UPDATE.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.complete(ctx, s.pool, "complete", key, token, result, ttl)
}

// Fail implements idempotency.Store with one UPDATE.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap("fail", key, err)
	}
	return s.owned(ctx, s.pool, "fail", key, token, s.sql.fail, micros(ttl))
}

// Release implements idempotency.Store with one DELETE or UPDATE.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := storekit.CheckRelease(key, token); err != nil {
		return wrap("release", key, err)
	}
	return s.owned(ctx, s.pool, "release", key, token, s.sql.release)
}

// owned runs an owner statement: nil when applied, else [sqlstore.Refused].
func (s *Store) owned(ctx context.Context, q Querier, op, key, token, stmt string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return wrap(op, key, sqlstore.WithContext(ctx, err))
	}
	var applied, found bool
	var r sqlstore.Row
	dest := append([]any{&applied, &found}, dest(&r)...)
	if err := q.QueryRow(ctx, stmt, append([]any{sqlstore.KeyHash(key), []byte(token)}, args...)...).Scan(dest...); err != nil {
		return s.queryError(ctx, op, key, err)
	}
	if applied {
		return nil
	}
	switch err := sqlstore.Refused(op, found, &r, token); {
	case err == nil, errors.Is(err, sqlstore.ErrRenewRaced):
		return err
	default:
		return wrap(op, key, err)
	}
}

// Get implements idempotency.Store with one SELECT.
func (s *Store) Get(ctx context.Context, key string) (idempotency.Record, error) {
	return s.d.Get(ctx, key)
}

// Delete implements idempotency.Store with one DELETE; it removes a corrupt row too.
func (s *Store) Delete(ctx context.Context, key string) error { return s.d.Delete(ctx, key) }

func micros(d time.Duration) int64 { return sqlstore.DurationMicros(d) }

// queryError translates a pgx error: a CHECK violation (of a constraint
// added NOT VALID) is a corrupt record, a missing table says how to create
// it, a context's end matches it.
func (s *Store) queryError(ctx context.Context, op, key string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23514": // check_violation
			return wrap(op, key, fmt.Errorf("%w: %w", idempotency.ErrCorruptRecord, err))
		case "42P01": // undefined_table
			return wrap(op, key, fmt.Errorf("table %s does not exist (create it with Migrate or Schema): %w", s.table, err))
		}
	}
	return wrap(op, key, withContext(ctx, err))
}

func wrap(op, key string, err error) error { return sqlstore.Wrap("pgstore", op, key, err) }

func withContext(ctx context.Context, err error) error { return sqlstore.WithContext(ctx, err) }
