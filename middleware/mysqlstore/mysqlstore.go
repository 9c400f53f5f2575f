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
	// errNilDB is New's error for a nil *sql.DB.
	errNilDB = errors.New("mysqlstore: nil *sql.DB")
	// errTooLong is Claim's error for a token longer than maxTokenBytes or
	// a fingerprint longer than maxFingerprintBytes: their columns are
	// bounded, and a server outside strict SQL mode would silently cut them.
	errTooLong = errors.New("mysqlstore: value longer than its column")
)

// The bounds of the bounded columns.
const (
	// maxTokenBytes is the longest owner token (VARBINARY(255));
	// storekit.NewToken makes 32-byte tokens.
	maxTokenBytes = 255
	// maxFingerprintBytes is the longest fingerprint (BLOB).
	maxFingerprintBytes = 65535
)

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table holds the records: lower-case ASCII letters, digits and
	// underscores, not starting with a digit, at most 51 bytes (its CHECK
	// constraint adds "_record_valid" within 64), optionally qualified by a
	// database of the same form ("idempotency.keys"). Names are quoted in
	// every statement. The default is idempotency_keys, in the
	// connection's current database.
	Table string
}

// constraintSuffix makes the name of the table's CHECK constraint from the
// table's: MySQL names constraints per database, not per table, so two
// tables of the store in one database need two names.
const constraintSuffix = "_record_valid"

// maxIdentifier is the length of a MySQL and MariaDB identifier, in
// characters (here bytes: only ASCII is accepted).
const maxIdentifier = 64

// Schema returns the DDL that creates cfg's table, with its index and CHECK
// constraint, for your own migrations: the SQL that [Store.Migrate] runs.
func Schema(cfg Config) (string, error) {
	table, parts, err := sqlstore.ParseTable("mysqlstore", cfg.Table, maxIdentifier, constraintSuffix)
	if err != nil {
		return "", err
	}
	return buildStatements(quoteTable(table), quote(parts[len(parts)-1]+constraintSuffix)).schema, nil
}

// quote returns a validated identifier in backquotes.
func quote(name string) string { return "`" + name + "`" }

// quoteTable returns a validated, optionally qualified, table name quoted.
func quoteTable(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = quote(p)
	}
	return strings.Join(parts, ".")
}

// Store is an [idempotency.Store] on a MySQL or MariaDB (InnoDB) table. It is
// safe for concurrent use and does not own the *sql.DB: closing it is the
// caller's business. It prepares each of its statements once, on first
// use; Close releases them.
type Store struct {
	db    *sql.DB
	table string // as configured, for messages
	sql   statements

	mu       sync.Mutex
	prepared map[string]*sql.Stmt
	d        sqlstore.Dialect
}

var _ idempotency.Store = (*Store)(nil)

// New returns a store on db, keeping its records in cfg.Table. db must use
// github.com/go-sql-driver/mysql (driver name "mysql"); no DSN option is
// required, and none changes what the store reads. New does not contact the
// server and creates nothing: create the table once with Migrate, or with
// the DDL that [Schema] returns.
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

// Close releases the store's prepared statements. It does not close the
// *sql.DB. The store prepares them again if it is used after Close.
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

// Migrate creates the store's table, with its index and CHECK constraint,
// unless it exists. It is one CREATE TABLE IF NOT EXISTS, which MySQL and
// MariaDB run under a metadata lock on the table's name, so it is safe to
// run at every start, from any number of processes at once. It never alters
// an existing table. Like every DDL statement it commits implicitly: run it
// outside a transaction.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.sql.schema); err != nil {
		return fmt.Errorf("mysqlstore: migrate %s: %w", s.table, withContext(ctx, err))
	}
	return nil
}

// maxClaimReads bounds how often Claim writes again when its read found the
// row changed by someone else in between (see Claim).
const maxClaimReads = 4

// Claim implements idempotency.Store with two statements: an INSERT … ON
// DUPLICATE KEY UPDATE that decides and writes, atomically under the row's
// lock, and a SELECT of the row it left.
//
// MySQL cannot return the row from the write, so the read decides what the
// write did: the claim acquired iff the row is IN_PROGRESS under the
// request's token (tokens are unique to their claim, so only this claim or
// a resend of it can have written it; no other claim can have taken it
// since, or the token would be another's), unless the stored fingerprint
// differs (a refusal that keeps a row a resend may have left under this
// token). That holds even when the lease lapsed between the two statements
// (a lease shorter than a round trip, or a stalled connection): the claim
// is then reported acquired with its lapsed deadline, and the owner's first
// renewal or completion finds the lease lost, rather than the claim being
// run again and counting an attempt per try. Between the two statements the row can only move on: the holder
// may complete or fail it, or its lease may lapse or the record expire.
// When the read finds a record that this claim would have acquired (absent,
// expired, FAILED, a lapsed lease), the claim is run again, so that no
// caller is refused by a record that no longer refuses it.
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

// prepareCompletion prepares the completion's statement on the pool once,
// before a run needs it: the in-transaction completion runs it on the
// transaction's connection and can prepare it there (once per connection)
// only from a statement of the pool's, which it must not take a connection
// to make. A failure is left for the next claim.
func (s *Store) prepareCompletion(ctx context.Context) {
	if s.preparedStmt(s.sql.complete) == nil {
		_, _ = s.stmt(ctx, s.sql.complete)
	}
}

// Renew implements idempotency.Store with one UPDATE. It answers
// idempotency.ErrCompletedByOwner when the key is COMPLETED by token: that
// is how a run learns that the transaction of its in-transaction
// completion (CompleteInTx) committed. The completion holds the row's
// exclusive lock until its transaction ends, so a renewal sent after it
// waits in its UPDATE, which then tests its WHERE on the row as the
// transaction left it: still the token's lease after a rollback (the
// renewal succeeds), COMPLETED after a commit (the UPDATE changes nothing).
// The read that then classifies the refusal is a locking read (LOCK IN
// SHARE MODE), which reads the row's latest committed version whatever the
// session's isolation level, as the UPDATE did.
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

// Release implements idempotency.Store with a DELETE (a first attempt's
// claim), and when that deleted nothing an UPDATE (a later attempt's).
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

// owned runs an owner statement (sql.go), whose last parameters are the
// key's hash and token, and reads its answer: nil when it changed the row,
// else what [sqlstore.Refused] makes of the row as a second statement reads
// it.
func (s *Store) owned(ctx context.Context, q runner, op, key, token, stmt string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return wrap(op, key, err)
	}
	hash := sqlstore.KeyHash(key)
	res, err := q.exec(ctx, stmt, append(args, hash, []byte(token))...)
	if err != nil {
		return s.queryError(ctx, op, key, err)
	}
	// Without the DSN option clientFoundRows, MySQL counts the rows the
	// statement changed, with it the rows it matched; every row the WHERE
	// matches is changed, but for a renewal in the microsecond of the last.
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return nil
	}
	fallback := q.fallback()
	if op == "renew" {
		// The witness of an in-transaction completion's commit (see Renew):
		// read the row as the UPDATE did, locked, never from a snapshot.
		fallback = s.sql.fallbackLocked
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

// Delete implements idempotency.Store with one DELETE, which removes any row,
// a corrupt one included.
func (s *Store) Delete(ctx context.Context, key string) error { return s.d.Delete(ctx, key) }

// checkLengths refuses a token or fingerprint longer than its column.
func checkLengths(token string, fingerprint []byte) error {
	if len(token) > maxTokenBytes {
		return fmt.Errorf("%w: the token has %d bytes, at most %d fit", errTooLong, len(token), maxTokenBytes)
	}
	if len(fingerprint) > maxFingerprintBytes {
		return fmt.Errorf("%w: the fingerprint has %d bytes, at most %d fit", errTooLong, len(fingerprint), maxFingerprintBytes)
	}
	return nil
}

// durationMicros is d in microseconds for the statements' INTERVALs.
func durationMicros(d time.Duration) int64 { return sqlstore.DurationMicros(d) }

// MySQL and MariaDB error numbers the store translates or retries.
const (
	errNoSuchTable         = 1146 // ER_NO_SUCH_TABLE
	errDeadlock            = 1213 // ER_LOCK_DEADLOCK
	errCheckMySQL          = 3819 // ER_CHECK_CONSTRAINT_VIOLATED (MySQL)
	errCheckMariaDB        = 4025 // ER_CONSTRAINT_FAILED (MariaDB)
	maxDeadlockRetries     = 5
	deadlockRetryBaseDelay = time.Millisecond
)

// queryError translates an error of the driver: a CHECK constraint that
// refuses to write a row back is a corrupt record; a missing table says how
// to create it; an error caused by the context's end matches its error.
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

// isNoSuchTable reports whether err is the server's error for a missing
// table.
func isNoSuchTable(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == errNoSuchTable
}

// isDeadlock reports whether err is InnoDB's deadlock error, after which
// the server has rolled the statement's transaction back.
func isDeadlock(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == errDeadlock
}

func wrap(op, key string, err error) error { return sqlstore.Wrap("mysqlstore", op, key, err) }

func withContext(ctx context.Context, err error) error { return sqlstore.WithContext(ctx, err) }
