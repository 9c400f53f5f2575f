// Package sqlstore is what the SQL stores (pgstore, mysqlstore) share: the
// record as their statements return it ([Row]), the owner decision on a
// refused owner statement ([Refused]), the transactional completion
// ([CompleteInTx]) and its errors, the purge loop ([PurgeEvery]), the
// listing of records ([Records]), the table name rules ([ParseTable]), and
// Get, Delete and the purge on a [Dialect]. Each dialect gives its SQL and
// its driver glue.
//
// The errors of transactional completion are defined here, once: each
// store's ErrAlreadyCompleted is [ErrAlreadyCompleted], so errors.Is
// matches whichever store returned it.
package sqlstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

var (
	// ErrNoRun is CompleteInTx's error for a context that belongs to no run
	// of the idempotency middleware or of Once.Do.
	ErrNoRun = errors.New("the context belongs to no idempotent run (use the handler's msg.Context() or Do's work context)")
	// ErrForeignRun is CompleteInTx's error for a run claimed in another
	// store (Redis, say, or another table): nothing was written.
	ErrForeignRun = errors.New("the run was claimed in another store (this table has no record of its key): make this store the middleware's Config.Store")
	// ErrAlreadyCompleted is CompleteInTx's error when the run's own
	// COMPLETED record was committed before, by an earlier transaction of
	// the run: the caller must roll back, its effect is already in.
	ErrAlreadyCompleted = errors.New("the run already committed its COMPLETED record and its effect")
	// ErrInvalidTable is New's and Schema's error for a Config.Table that is
	// not a plain, optionally qualified, identifier.
	ErrInvalidTable = errors.New("invalid table name")
)

// ValidSQL is the record's invariant as an SQL condition on the columns
// prefixed by {r}, true or false, never NULL; empty is the dialect's empty
// binary string. It is the table's CHECK constraint (CheckSQL) plus the NOT
// NULL columns, and exactly what [Row.Check] accepts: the stores write only
// rows it holds true for, so a table without the constraint is protected by
// the statements themselves.
func ValidSQL(empty string) string {
	return `COALESCE({r}attempts >= 1
	AND {r}created_at IS NOT NULL AND {r}updated_at IS NOT NULL AND {r}expires_at IS NOT NULL
	AND ` + stateSQL("{r}", empty) + `, FALSE)`
}

// CheckSQL is ValidSQL for the CHECK constraint: a CHECK passes on NULL,
// and the NOT NULL columns are checked by their own constraints.
func CheckSQL(empty string) string {
	return `attempts >= 1
	AND ` + stateSQL("", empty)
}

func stateSQL(r, empty string) string {
	return strings.NewReplacer("{r}", r, "{empty}", empty).Replace(`CASE {r}state
		WHEN 'in_progress' THEN {r}token <> {empty} AND {r}lease_until IS NOT NULL AND {r}claim_ttl_us > 0 AND {r}result IS NULL
		WHEN 'completed' THEN {r}token <> {empty} AND {r}lease_until IS NULL AND {r}claim_ttl_us IS NULL AND {r}result IS NOT NULL
		WHEN 'failed' THEN {r}lease_until IS NULL AND {r}claim_ttl_us IS NULL AND {r}result IS NULL
		ELSE FALSE END`)
}

// DefaultTable is the table of a Config whose Table is empty.
const DefaultTable = "idempotency_keys"

// OpCompleteTx names the in-transaction completion in errors and tells
// Refused that a COMPLETED record of the same token is not a resend.
const OpCompleteTx = "complete in transaction"

// ErrRenewRaced is Refused's answer to a renewal refused although the row
// it read is the token's live lease: the row changed while the statement
// waited for it (PostgreSQL runs the renewal again), or it matched within
// the microsecond of its deadline (MySQL: the renewal stands).
var ErrRenewRaced = errors.New("the row changed while the renewal waited for it")

// Refused classifies an owner statement (op: "renew", "complete", "fail",
// "release" or OpCompleteTx) of token that changed nothing, from the row it
// read afterwards (found false: no row). It returns ErrCorruptRecord for a
// corrupt row; nil for the token's own resent Complete or Fail and for any
// Release (nothing of the token's is left to undo); ErrAlreadyCompleted for
// a second completion in a transaction; ErrCompletedByOwner or
// ErrRenewRaced for a renewal; and ErrLeaseLost otherwise. The caller wraps
// it with the operation and key.
func Refused(op string, found bool, r *Row, token string) error {
	if found {
		if err := r.Check(); err != nil {
			return err
		}
		own := !r.Expired() && string(r.Token) == token
		switch {
		case own && op == "renew" && *r.State == StateCompleted:
			// The owner's own Complete, most often its transaction's,
			// committed: the lease ended without anyone taking it.
			return idempotency.ErrCompletedByOwner
		case own && op == "renew" && r.Live():
			return ErrRenewRaced
		case own && (op == "complete" && *r.State == StateCompleted || op == "fail" && *r.State == StateFailed):
			return nil // the token's own transition, resent
		case own && op == OpCompleteTx && *r.State == StateCompleted:
			// Not a resend: another transaction of this run committed its
			// effect and COMPLETED already; this one must not commit.
			return ErrAlreadyCompleted
		}
	}
	if op == "release" {
		return nil
	}
	return idempotency.ErrLeaseLost
}

// CompleteInTx is the stores' CompleteInTx and CompleteValueInTx: it
// writes COMPLETED for the run of ctx with complete (the store's fenced
// UPDATE in the caller's transaction), the run's result being result(run).
// A fence that fails for a run claimed in a store that is not recognisably
// s (directly or through Unwrap) is ErrForeignRun when s holds no record of
// the key: a run claimed in s leaves its record for at least its TTL. A
// wrapper that does not unwrap still gets ErrLeaseLost for a lost lease,
// since the key's record is then in the table. On success the run keeps
// renewing until a renewal tells the transaction's outcome. ErrNoRun and
// ErrForeignRun are prefixed with pkg.
func CompleteInTx(ctx context.Context, pkg string, s idempotency.Store, result func(*storekit.Run) []byte,
	complete func(ctx context.Context, key, token string, result []byte, ttl time.Duration) error) error {
	run, ok := storekit.RunFromContext(ctx)
	if !ok {
		return fmt.Errorf("%s: %w", pkg, ErrNoRun)
	}
	err := complete(ctx, run.Key(), run.Token(), result(run), run.CompletedTTL())
	if errors.Is(err, idempotency.ErrLeaseLost) && !run.ClaimedIn(func(st any) bool { return st == s }) {
		if rec, gerr := s.Get(ctx, run.Key()); gerr == nil && rec.State == idempotency.StateAbsent {
			return fmt.Errorf("%s: %w (the run's store is a %T)", pkg, ErrForeignRun, run.Store())
		}
	}
	if err != nil {
		return err
	}
	run.CompletedInTransaction()
	return nil
}

// CheckKey is the check of Get and Delete before a statement: a key, and a
// context that has not ended.
func CheckKey(ctx context.Context, key string) error {
	if key == "" {
		return idempotency.ErrEmptyKey
	}
	return ctx.Err()
}

// KeyHash is the primary key of key's row.
func KeyHash(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// DurationMicros returns d in whole microseconds, rounded up so that a
// positive duration stays positive, after clamping it to
// idempotency.MaxTTL: the rounding must not overflow into a negative
// interval (a lease already over), and a deadline must stay within the
// server's range of times (PostgreSQL's, and DATETIME's year 9999). A
// renewal adds the claim's TTL to its lease: two MaxTTLs from now is still
// there.
func DurationMicros(d time.Duration) int64 {
	d = storekit.ClampTTL(d)
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// WithContext adds the context's error to err when the context has ended
// and err does not already match it, so that callers can test for
// context.DeadlineExceeded or context.Canceled, and the context's cause
// (context.Cause) when it is another error: a handler's context cancelled
// because its run's lease was lost makes CompleteInTx's error match
// idempotency.ErrLeaseLost.
func WithContext(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if cerr == nil {
		return err
	}
	if !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// maxKeyInError bounds how much of a key an error message quotes.
const maxKeyInError = 64

// Wrap is err of the store named pkg, for op on key.
func Wrap(pkg, op, key string, err error) error {
	if len(key) > maxKeyInError {
		return fmt.Errorf("%s: %s %q… (%d bytes): %w", pkg, op, key[:maxKeyInError], len(key), err)
	}
	return fmt.Errorf("%s: %s %q: %w", pkg, op, key, err)
}

// ParseTable validates Config.Table of the store named pkg, empty meaning
// DefaultTable, and returns it and its parts: one or two parts (a
// qualifier and the table) of lower-case ASCII letters, digits and
// underscores, not starting with a digit, each at most maxIdent bytes, the
// table short enough that table+suffix (the name of its index or
// constraint) fits in maxIdent too. Such names mean the same quoted or
// not, whatever the server's case rules.
func ParseTable(pkg, table string, maxIdent int, suffix string) (string, []string, error) {
	if table == "" {
		table = DefaultTable
	}
	parts, err := parseTable(table, maxIdent, suffix)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", pkg, err)
	}
	return table, parts, nil
}

func parseTable(table string, maxIdent int, suffix string) ([]string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: %q has more than one dot", ErrInvalidTable, table)
	}
	for _, p := range parts {
		if !isIdentifier(p, maxIdent) {
			return nil, fmt.Errorf("%w: %q: each part must be lower-case ASCII letters, digits and underscores, not starting with a digit, at most %d bytes",
				ErrInvalidTable, table, maxIdent)
		}
	}
	if len(parts[len(parts)-1])+len(suffix) > maxIdent {
		return nil, fmt.Errorf("%w: %q: the table name may be at most %d bytes", ErrInvalidTable, table, maxIdent-len(suffix))
	}
	return parts, nil
}

func isIdentifier(s string, maxIdent int) bool {
	if s == "" || len(s) > maxIdent {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// StateNames are the state column's values of states, for DeleteIf of
// key; an empty key, or a state that a row cannot be in (StateAbsent), is
// an error.
func StateNames(key string, states []idempotency.State) ([]string, error) {
	if key == "" {
		return nil, idempotency.ErrEmptyKey
	}
	names := make([]string, 0, len(states))
	for _, st := range states {
		switch st {
		case idempotency.StateInProgress:
			names = append(names, StateInProgress)
		case idempotency.StateFailed:
			names = append(names, StateFailed)
		case idempotency.StateCompleted:
			names = append(names, StateCompleted)
		default:
			return nil, fmt.Errorf("cannot select records in state %s", st)
		}
	}
	return names, nil
}

// StateOf is the State of a state column's value.
func StateOf(name string) idempotency.State {
	switch name {
	case StateInProgress:
		return idempotency.StateInProgress
	case StateFailed:
		return idempotency.StateFailed
	case StateCompleted:
		return idempotency.StateCompleted
	}
	return idempotency.StateAbsent
}

// PageSize is the rows per query of the stores' Records.
const PageSize = 500

// Rows is what Records reads of a driver's result set (pgx.Rows,
// *sql.Rows).
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Records is the stores' Records: pages of batch rows, each page read by
// query (the page statement from after, and how to close its rows), whose
// columns are key_hash, key, the row's size and then a record's (dest gives
// their destinations). A corrupt row is an entry with Err (wrapped by
// wrap); a failed query (wrapped by queryError) ends the walk. Expiry is
// the statement's to test, on the server's clock.
func Records(batch int, dest func(r *Row) []any, query func(after []byte) (Rows, func(), error),
	wrap func(key string, err error) error, queryError func(error) error) iter.Seq2[idempotency.Entry, error] {
	return pages(batch, func(after []byte) ([]idempotency.Entry, []byte, error) {
		rows, done, err := query(after)
		if err != nil {
			return nil, nil, queryError(err)
		}
		defer done()
		page, last, err := readPage(rows, dest, wrap)
		if err != nil {
			return nil, nil, queryError(err)
		}
		return page, last, nil
	})
}

func readPage(rows Rows, dest func(r *Row) []any, wrap func(key string, err error) error) (page []idempotency.Entry, last []byte, err error) {
	for rows.Next() {
		var key []byte
		var e idempotency.Entry
		var r Row
		if err := rows.Scan(append([]any{&last, &key, &e.Bytes}, dest(&r)...)...); err != nil {
			return nil, nil, err
		}
		e.Key = string(key)
		if err := r.Check(); err != nil {
			e.Err = wrap(e.Key, err)
		} else {
			e.Record, e.TTL = r.Record(true), r.TTL()
		}
		page = append(page, e)
	}
	return page, last, rows.Err()
}

// pages walks a keyset pagination of batch rows a page, as the stores'
// Records do: read returns the rows whose key_hash is above after (empty
// for the first page) and the last row's key_hash. Each page is read to its
// end, its rows closed, before any of it is yielded, so no query is open
// while the caller's loop runs. A read's error is yielded and ends the
// walk; a page shorter than batch is the last.
func pages(batch int, read func(after []byte) (page []idempotency.Entry, last []byte, err error)) iter.Seq2[idempotency.Entry, error] {
	return func(yield func(idempotency.Entry, error) bool) {
		after := []byte{}
		for {
			page, last, err := read(after)
			if err != nil {
				yield(idempotency.Entry{}, err)
				return
			}
			for _, e := range page {
				if !yield(e, nil) {
					return
				}
			}
			if len(page) < batch {
				return
			}
			after = last
		}
	}
}
