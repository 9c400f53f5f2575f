package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

var (
	errNilDB = errors.New("mysqlstore: nil *sql.DB")
	// errTooLong refuses what a server outside strict mode would cut silently.
	errTooLong = errors.New("mysqlstore: value longer than its column")
)

const (
	maxTokenBytes       = 255   // VARBINARY(255)
	maxFingerprintBytes = 65535 // BLOB
)

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table holds the records: at most 51 bytes of [a-z0-9_], no leading digit,
	// maybe qualified ("idempotency.keys"). The default is idempotency_keys.
	Table string
}

// constraintSuffix: MySQL names constraints per database, so per table here.
const constraintSuffix = "_record_valid"

const maxIdentifier = 64 // bytes of an identifier (ASCII only)

// Schema returns the DDL that [Store.Migrate] runs, for your own migrations.
func Schema(cfg Config) (string, error) {
	table, parts, err := sqlstore.ParseTable("mysqlstore", cfg.Table, maxIdentifier, constraintSuffix)
	if err != nil {
		return "", err
	}
	return buildStatements(quoteTable(table), quote(parts[len(parts)-1]+constraintSuffix)).schema, nil
}

func quote(name string) string { return "`" + name + "`" }

func quoteTable(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = quote(p)
	}
	return strings.Join(parts, ".")
}

// Store is an [idempotency.Store] on a MySQL or MariaDB (InnoDB) table, safe
// for concurrent use. It does not own the *sql.DB.
type Store struct {
	db    *sql.DB
	table string // as configured, for messages
	sql   statements

	mu       sync.Mutex
	prepared map[string]*sql.Stmt
	d        sqlstore.Dialect
}

var _ idempotency.Store = (*Store)(nil)

// New returns a store on db (github.com/go-sql-driver/mysql). It does not
// contact the server.
func New(db *sql.DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errNilDB
	}
	table, parts, err := sqlstore.ParseTable("mysqlstore", cfg.Table, maxIdentifier, constraintSuffix)
	if err != nil {
		return nil, err
	}
	st := buildStatements(quoteTable(table), quote(parts[len(parts)-1]+constraintSuffix))
	s := &Store{db: db, table: table, sql: st, prepared: map[string]*sql.Stmt{}}
	s.d = sqlstore.Dialect{Pkg: "mysqlstore", Table: table,
		GetSQL: st.get, DeleteSQL: st.del, PageSQL: s.inspectSQL().page,
		PageArgs: func(after []byte, prefix string, batch int) []any {
			return []any{after, []byte(prefix), []byte(prefix), batch}
		},
		Dest: dest,
		QueryRow: func(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
			return dbRunner{s}.queryRow(ctx, q, args...)
		},
		IsNoRows: func(err error) bool { return errors.Is(err, sql.ErrNoRows) },
		Exec: func(ctx context.Context, q string, args ...any) (int64, error) {
			res, err := dbRunner{s}.exec(ctx, q, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		Query: func(ctx context.Context, q string, args ...any) (sqlstore.Rows, func(), error) {
			rows, err := db.QueryContext(ctx, q, args...)
			if err != nil {
				return nil, nil, err
			}
			return rows, func() { _ = rows.Close() }, nil
		},
		QueryError:    s.queryError,
		DeleteExpired: s.deleteExpired,
	}
	return s, nil
}

// Close releases the prepared statements, not the *sql.DB. A later call prepares them again.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for q, st := range s.prepared {
		errs = append(errs, st.Close())
		delete(s.prepared, q)
	}
	return errors.Join(errs...)
}

// Migrate creates the table unless it exists, safe from many processes at
// once; it never alters one. It commits implicitly: run it outside a transaction.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.sql.schema); err != nil {
		return fmt.Errorf("mysqlstore: migrate %s: %w", s.table, withContext(ctx, err))
	}
	return nil
}

const maxClaimReads = 4 // writes of one Claim whose row moved on meanwhile

// Claim implements idempotency.Store with an INSERT … ON DUPLICATE KEY
// UPDATE, then a SELECT: acquired iff the row is IN_PROGRESS under the
// token with no other fingerprint. A row moved on to a claimable one is claimed again.
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := storekit.CheckClaim(key, req.Token, req.Lease, req.TTL); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	if err := checkLengths(req.Token, req.Fingerprint); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	var fp any // NULL for none
	if len(req.Fingerprint) > 0 {
		fp = req.Fingerprint
	}
	hash := sqlstore.KeyHash(key)
	tok := []byte(req.Token)
	lease, ttl := durationMicros(req.Lease), durationMicros(req.TTL)
	db := dbRunner{s}
	for i := 1; ; i++ {
		if _, err := db.exec(ctx, s.sql.claim, hash, []byte(key), tok, fp, lease, ttl, lease+ttl,
			fp, fp, tok, tok, fp, fp, lease, ttl, lease+ttl); err != nil {
			return idempotency.ClaimResult{}, s.queryError(ctx, "claim", key, err)
		}
		var r sqlstore.Row
		err := db.queryRow(ctx, s.sql.get, hash).Scan(dest(&r)...)
		if errors.Is(err, sql.ErrNoRows) {
			if i < maxClaimReads {
				continue // deleted since the write
			}
			return idempotency.ClaimResult{Record: idempotency.Record{State: idempotency.StateAbsent}}, nil
		}
		if err != nil {
			return idempotency.ClaimResult{}, s.queryError(ctx, "claim", key, err)
		}
		if err := r.Check(); err != nil {
			return idempotency.ClaimResult{}, wrap("claim", key, err)
		}
		refusedFP := fp != nil && len(r.Fingerprint) > 0 && string(req.Fingerprint) != string(r.Fingerprint)
		if !r.Expired() && r.ClaimedBy(req.Token) && !refusedFP {
			s.prepareCompletion(ctx)
			return idempotency.ClaimResult{Acquired: true, Record: claimedRecord(&r)}, nil
		}
		claimable := r.Expired() || *r.State == sqlstore.StateFailed || (*r.State == sqlstore.StateInProgress && !r.Live())
		if claimable && !refusedFP && i < maxClaimReads {
			continue // the record moved on since the write
		}
		if r.Expired() {
			return idempotency.ClaimResult{Record: idempotency.Record{State: idempotency.StateAbsent}}, nil
		}
		return idempotency.ClaimResult{Record: r.Record(false)}, nil
	}
}

// prepareCompletion prepares the completion on the pool, for CompleteInTx.
func (s *Store) prepareCompletion(ctx context.Context) {
	if s.preparedStmt(s.sql.complete) == nil {
		_, _ = s.stmt(ctx, s.sql.complete)
	}
}

// Renew implements idempotency.Store with one UPDATE. Its
// idempotency.ErrCompletedByOwner tells a run its CompleteInTx committed:
// the UPDATE waits on the row lock, and the refusal's read locks too.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	if err := storekit.CheckOwner(key, token, lease); err != nil {
		return wrap("renew", key, err)
	}
	l := durationMicros(lease)
	return s.owned(ctx, dbRunner{s}, "renew", key, token, s.sql.renew, l, l)
}

// Complete implements idempotency.Store with one UPDATE.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	return s.complete(ctx, dbRunner{s}, "complete", key, token, result, ttl)
}

// Fail implements idempotency.Store with one UPDATE.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap("fail", key, err)
	}
	return s.owned(ctx, dbRunner{s}, "fail", key, token, s.sql.fail, durationMicros(ttl))
}

// Release implements idempotency.Store with a DELETE, else an UPDATE.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := storekit.CheckRelease(key, token); err != nil {
		return wrap("release", key, err)
	}
	if err := ctx.Err(); err != nil {
		return wrap("release", key, err)
	}
	res, err := dbRunner{s}.exec(ctx, s.sql.releaseDelete, sqlstore.KeyHash(key), []byte(token))
	if err != nil {
		return s.queryError(ctx, "release", key, err)
	}
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return nil
	}
	return s.owned(ctx, dbRunner{s}, "release", key, token, s.sql.releaseUpdate)
}

// owned runs an owner statement (hash and token last): nil, or [sqlstore.Refused].
func (s *Store) owned(ctx context.Context, q runner, op, key, token, stmt string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return wrap(op, key, err)
	}
	hash := sqlstore.KeyHash(key)
	res, err := q.exec(ctx, stmt, append(args, hash, []byte(token))...)
	if err != nil {
		return s.queryError(ctx, op, key, err)
	}
	// Only a renewal within the microsecond of the last changes nothing.
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return nil
	}
	fallback := q.fallback()
	if op == "renew" {
		fallback = s.sql.fallbackLocked // as the UPDATE read it: see Renew
	}
	var r sqlstore.Row
	err = q.queryRow(ctx, fallback, hash).Scan(dest(&r)...)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return s.queryError(ctx, op, key, err)
	}
	switch err := sqlstore.Refused(op, err == nil, &r, token); {
	case err == nil, errors.Is(err, sqlstore.ErrRenewRaced):
		return nil // for a renewal: matched, but nothing changed within the microsecond
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

func checkLengths(token string, fingerprint []byte) error {
	if len(token) > maxTokenBytes {
		return fmt.Errorf("%w: the token has %d bytes, at most %d fit", errTooLong, len(token), maxTokenBytes)
	}
	if len(fingerprint) > maxFingerprintBytes {
		return fmt.Errorf("%w: the fingerprint has %d bytes, at most %d fit", errTooLong, len(fingerprint), maxFingerprintBytes)
	}
	return nil
}

func durationMicros(d time.Duration) int64 { return sqlstore.DurationMicros(d) }

const (
	errNoSuchTable         = 1146 // ER_NO_SUCH_TABLE
	errDeadlock            = 1213 // ER_LOCK_DEADLOCK
	errCheckMySQL          = 3819 // ER_CHECK_CONSTRAINT_VIOLATED (MySQL)
	errCheckMariaDB        = 4025 // ER_CONSTRAINT_FAILED (MariaDB)
	maxDeadlockRetries     = 5
	deadlockRetryBaseDelay = time.Millisecond
)

// queryError makes a CHECK violation a corrupt record, and names a missing table.
func (s *Store) queryError(ctx context.Context, op, key string, err error) error {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case errCheckMySQL, errCheckMariaDB:
			return wrap(op, key, fmt.Errorf("%w: %w", idempotency.ErrCorruptRecord, err))
		case errNoSuchTable:
			return wrap(op, key, fmt.Errorf("table %s does not exist (create it with Migrate or Schema): %w", s.table, err))
		}
	}
	return wrap(op, key, withContext(ctx, err))
}

func isNoSuchTable(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == errNoSuchTable
}

// isDeadlock reports InnoDB's deadlock error, which rolled the transaction back.
func isDeadlock(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == errDeadlock
}

func wrap(op, key string, err error) error { return sqlstore.Wrap("mysqlstore", op, key, err) }

func withContext(ctx context.Context, err error) error { return sqlstore.WithContext(ctx, err) }
