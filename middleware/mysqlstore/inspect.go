package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlrecord"
)

// This file is what an operator's tool (cmd/idemctl) needs: reading many
// records with keyset pagination, counting them by state, and deleting a key
// only in the states the operator named. None of it is on the path of a
// message.

// DefaultPageSize is the rows per query of Records when its batch is zero.
const DefaultPageSize = 500

// Entry is one record found by Records.
type Entry struct {
	// Key is the key as the store was given it (the key column).
	Key string
	// Record is the key's record.
	Record idempotency.Record
	// TTL is how long the row has left before it counts as absent
	// (expires_at minus the server's clock).
	TTL time.Duration
	// Bytes is the size of the row's values (the sum of its columns'
	// lengths), without InnoDB's row, page and index overhead.
	Bytes int64
	// Err is ErrCorruptRecord for a row that is not a well-formed record;
	// the walk goes on after it.
	Err error
}

// StateCount is how many live records of one state Counts found, and their
// mean size.
type StateCount struct {
	// Records is the number of rows.
	Records int64
	// MeanBytes is their mean size as Entry.Bytes counts it, rounded down.
	MeanBytes int64
}

// CountCorrupt is the key of Counts' map for rows that are not well-formed
// records (they are not an idempotency.State).
const CountCorrupt = "corrupt"

// inspectStatements are the operator's statements for the store's table.
type inspectStatements struct {
	now, inspect, page, lock, del, counts string
}

// logicalState is the state a row reads as: a lapsed lease is failed.
const logicalState = `(CASE WHEN r.state = 'in_progress' AND r.lease_until <= UTC_TIMESTAMP(6) THEN 'failed' ELSE r.state END)`

// rowBytes is the size of the row r's values: its variable columns'
// lengths and its fixed ones' sizes (BINARY(32), two BIGINTs, four
// DATETIME(6) of 8 bytes).
// A corrupt row's NULLs count as empty.
const rowBytes = "(32 + COALESCE(LENGTH(r.`key`), 0) + COALESCE(LENGTH(r.state), 0) + COALESCE(LENGTH(r.token), 0)" +
	" + COALESCE(LENGTH(r.fingerprint), 0) + COALESCE(LENGTH(r.result), 0) + 2*8 + 4*8)"

// prefixSQL selects the rows whose key starts with the bytes of the
// parameters (the prefix, twice).
const prefixSQL = "LEFT(r.`key`, LENGTH(?)) = ?"

func (s *Store) inspectSQL() inspectStatements {
	parts := strings.Split(s.table, ".") // validated by New
	for i, p := range parts {
		parts[i] = quote(p)
	}
	r := strings.NewReplacer("{t}", strings.Join(parts, "."), "{columns}", columns, "{valid_r}", valid("r."),
		"{state}", logicalState, "{prefix}", prefixSQL, "{bytes}", rowBytes)
	return inspectStatements{
		now:     r.Replace(`SELECT ` + micros("UTC_TIMESTAMP(6)")),
		inspect: r.Replace(`SELECT {bytes}, {columns} FROM {t} AS r WHERE r.key_hash = ?`),
		// Keyset pagination on the primary key: every page is an index range
		// scan that starts where the last one ended, whatever the table's
		// size. Expired rows are left out unless they are corrupt.
		page: r.Replace("SELECT r.key_hash, r.`key`, {bytes}, {columns} FROM {t} AS r" + `
	WHERE r.key_hash > ? AND {prefix}
	AND (NOT {valid_r} OR r.expires_at > UTC_TIMESTAMP(6))
	ORDER BY r.key_hash LIMIT ?`),
		lock: r.Replace(`SELECT {valid_r}, r.expires_at <= UTC_TIMESTAMP(6), {state} FROM {t} AS r WHERE r.key_hash = ? FOR UPDATE`),
		del:  r.Replace(`DELETE FROM {t} WHERE key_hash = ?`),
		counts: r.Replace(`SELECT CASE WHEN NOT {valid_r} THEN 'corrupt' ELSE {state} END AS st, COUNT(*), CAST(FLOOR(COALESCE(AVG({bytes}), 0)) AS SIGNED)
	FROM {t} AS r WHERE {prefix}
	AND (NOT {valid_r} OR r.expires_at > UTC_TIMESTAMP(6))
	GROUP BY st`),
	}
}

// Now returns the server's clock, UTC_TIMESTAMP(6), the clock of every
// record's times.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.db.QueryRowContext(ctx, s.inspectSQL().now).Scan(sqlrecord.Micros{At: &now}); err != nil {
		return time.Time{}, fmt.Errorf("mysqlstore: now: %w", withContext(ctx, err))
	}
	return now, nil
}

// Inspect returns key's record, how long its row has left before it counts
// as absent, and the row's size (Entry.Bytes). An absent or expired key is
// StateAbsent with zero TTL and size.
func (s *Store) Inspect(ctx context.Context, key string) (rec idempotency.Record, ttl time.Duration, bytes int64, err error) {
	if key == "" {
		return rec, 0, 0, wrap("inspect", key, idempotency.ErrEmptyKey)
	}
	hash := keyHash(key)
	var r row
	err = s.db.QueryRowContext(ctx, s.inspectSQL().inspect, hash[:]).Scan(append([]any{&bytes}, r.dest()...)...)
	if errors.Is(err, sql.ErrNoRows) {
		return idempotency.Record{State: idempotency.StateAbsent}, 0, 0, nil
	}
	if err != nil {
		return rec, 0, 0, s.queryError(ctx, "inspect", key, err)
	}
	if rec, ttl, bytes, err = r.Inspected(bytes); err != nil {
		return rec, 0, bytes, wrap("inspect", key, err)
	}
	return rec, ttl, bytes, nil
}

// Records walks the live records whose key starts with prefix (all when it
// is empty) in key_hash order, batch rows per query (zero means
// DefaultPageSize), and yields each. It pages by key_hash (keyset
// pagination): each query is a range scan of the primary key from where the
// last one ended, holds no lock and no transaction across pages, so a
// record changed during the walk is seen as it is when its page is read. The
// key prefix is filtered on the server; a selective prefix on a large
// table still reads the whole index. Expired rows are skipped; corrupt ones
// are yielded with Entry.Err. The iterator's error is a failed query (the
// walk then ends).
func (s *Store) Records(ctx context.Context, prefix string, batch int) iter.Seq2[Entry, error] {
	if batch <= 0 {
		batch = DefaultPageSize
	}
	stmt := s.inspectSQL().page
	return sqlrecord.Pages(batch, func(after []byte) (page []Entry, last []byte, err error) {
		rows, err := s.db.QueryContext(ctx, stmt, after, []byte(prefix), []byte(prefix), batch)
		if err != nil {
			return nil, nil, s.queryError(ctx, "records", prefix, err)
		}
		defer rows.Close()
		for rows.Next() {
			var key []byte
			var e Entry
			var r row
			if err := rows.Scan(append([]any{&last, &key, &e.Bytes}, r.dest()...)...); err != nil {
				return nil, nil, s.queryError(ctx, "records", prefix, err)
			}
			e.Key = string(key)
			if e.Record, e.TTL, e.Err = r.Listed(); e.Err != nil {
				e.Err = wrap("records", e.Key, e.Err)
			}
			page = append(page, e)
		}
		if err := rows.Err(); err != nil {
			return nil, nil, s.queryError(ctx, "records", prefix, err)
		}
		return page, last, nil
	})
}

// Counts returns how many live records under prefix are in each state (by
// State.String(): in_progress, completed, failed — a lapsed lease counts as
// failed — and CountCorrupt for rows that are not records), with their mean
// size, in one aggregate query over the table.
func (s *Store) Counts(ctx context.Context, prefix string) (map[string]StateCount, error) {
	rows, err := s.db.QueryContext(ctx, s.inspectSQL().counts, []byte(prefix), []byte(prefix))
	if err != nil {
		return nil, s.queryError(ctx, "counts", prefix, err)
	}
	defer rows.Close()
	out := map[string]StateCount{}
	for rows.Next() {
		var state string
		var c StateCount
		if err := rows.Scan(&state, &c.Records, &c.MeanBytes); err != nil {
			return nil, s.queryError(ctx, "counts", prefix, err)
		}
		out[state] = c
	}
	if err := rows.Err(); err != nil {
		return nil, s.queryError(ctx, "counts", prefix, err)
	}
	return out, nil
}

// DeleteIf deletes key's row only when its record is in one of states
// (StateInProgress meaning a live lease; a lapsed lease is StateFailed),
// and reports the state it found: StateAbsent for a key it does not hold.
// It is a short READ COMMITTED transaction (a SELECT … FOR UPDATE, the
// DELETE when the state is one of states, COMMIT), so the state it reports
// is the one it deleted. An owner whose record was deleted gets
// ErrLeaseLost from its next renewal, Complete or Fail, and its work's
// context is cancelled. A corrupt row is ErrCorruptRecord and is not
// deleted (use Delete for it).
func (s *Store) DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error) {
	if key == "" {
		return 0, false, wrap("delete if", key, idempotency.ErrEmptyKey)
	}
	wanted := map[string]bool{}
	for _, st := range states {
		switch st {
		case idempotency.StateInProgress, idempotency.StateFailed, idempotency.StateCompleted:
			wanted[st.String()] = true
		default:
			return 0, false, wrap("delete if", key, fmt.Errorf("cannot select records in state %s", st))
		}
	}
	byName := map[string]idempotency.State{stateInProgress: idempotency.StateInProgress, stateFailed: idempotency.StateFailed,
		stateCompleted: idempotency.StateCompleted}
	hash := keyHash(key)
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
	err = tx.QueryRowContext(ctx, stmts.lock, hash[:]).Scan(&isValid, &expiredOrNull, &stateOrNull)
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
		return 0, false, wrap("delete if", key, fmt.Errorf("%w: %w", idempotency.ErrCorruptRecord, sqlrecord.ErrMalformed))
	case expired:
		return idempotency.StateAbsent, false, nil
	case !wanted[state]:
		return byName[state], false, nil
	}
	if _, err := tx.ExecContext(ctx, stmts.del, hash[:]); err != nil {
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	return byName[state], true, nil
}
