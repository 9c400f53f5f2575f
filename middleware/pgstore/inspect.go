package pgstore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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
	// Bytes is the row's size as stored (pg_column_size of the row, after
	// compression, without index and page overhead).
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
	// MeanBytes is their mean pg_column_size, rounded down.
	MeanBytes int64
}

// CountCorrupt is the key of Counts' map for rows that are not well-formed
// records (they are not a idempotency.State).
const CountCorrupt = "corrupt"

// inspectStatements are the operator's statements for the store's table.
type inspectStatements struct {
	inspect, page, deleteIf, counts string
}

// logicalState is the state a row reads as: a lapsed lease is failed.
const logicalState = `(CASE WHEN r.state = 'in_progress' AND r.lease_until <= statement_timestamp() THEN 'failed' ELSE r.state END)`

// prefixSQL selects the rows whose key starts with the bytes of $2.
const prefixSQL = `substring(r.key from 1 for octet_length($2::bytea)) = $2::bytea`

func (s *Store) inspectSQL() inspectStatements {
	t := pgx.Identifier(strings.Split(s.table, ".")).Sanitize() // validated by New
	r := strings.NewReplacer("{t}", t, "{columns}", columns, "{valid_r}", valid("r"), "{state}", logicalState, "{prefix}", prefixSQL)
	return inspectStatements{
		inspect: r.Replace(`SELECT pg_column_size(r.*), {columns} FROM {t} AS r WHERE r.key_hash = $1`),
		// Keyset pagination on the primary key: every page is an index range
		// scan that starts where the last one ended, whatever the table's
		// size. Expired rows are left out unless they are corrupt.
		page: r.Replace(`SELECT r.key_hash, r.key, pg_column_size(r.*), {columns} FROM {t} AS r
	WHERE r.key_hash > $1 AND {prefix}
	AND (NOT {valid_r} OR r.expires_at > statement_timestamp())
	ORDER BY r.key_hash LIMIT $3`),
		deleteIf: r.Replace(`DELETE FROM {t} AS r WHERE r.key_hash = $1 AND {valid_r}
	AND r.expires_at > statement_timestamp() AND {state} = ANY($2::text[])
	RETURNING {state}`),
		counts: r.Replace(`SELECT CASE WHEN NOT {valid_r} THEN 'corrupt' ELSE {state} END, count(*), COALESCE(avg(pg_column_size(r.*)), 0)::bigint
	FROM {t} AS r WHERE substring(r.key from 1 for octet_length($1::bytea)) = $1::bytea
	AND (NOT {valid_r} OR r.expires_at > statement_timestamp())
	GROUP BY 1`),
	}
}

// Inspect returns key's record, how long its row has left before it counts
// as absent, and the row's size (pg_column_size). An absent or expired key
// is StateAbsent with zero TTL and size.
func (s *Store) Inspect(ctx context.Context, key string) (rec idempotency.Record, ttl time.Duration, bytes int64, err error) {
	if key == "" {
		return rec, 0, 0, wrap("inspect", key, idempotency.ErrEmptyKey)
	}
	hash := keyHash(key)
	var r row
	err = s.pool.QueryRow(ctx, s.inspectSQL().inspect, hash[:]).Scan(append([]any{&bytes}, r.dest()...)...)
	if errors.Is(err, pgx.ErrNoRows) {
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
		rows, err := s.pool.Query(ctx, stmt, after, []byte(prefix), batch)
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
	rows, err := s.pool.Query(ctx, s.inspectSQL().counts, []byte(prefix))
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

// DeleteIf deletes key's row, in one statement, only when its record is in
// one of states (StateInProgress meaning a live lease; a lapsed lease is
// StateFailed), and reports the state it found: StateAbsent for a key it
// does not hold. An owner whose record was deleted gets ErrLeaseLost from
// its next renewal, Complete or Fail, and its work's context is cancelled.
// A corrupt row is ErrCorruptRecord and is not deleted (use Delete for it).
// When nothing was deleted, the state is read by a second statement, so it
// may be newer than what the DELETE saw.
func (s *Store) DeleteIf(ctx context.Context, key string, states ...idempotency.State) (found idempotency.State, deleted bool, err error) {
	if key == "" {
		return 0, false, wrap("delete if", key, idempotency.ErrEmptyKey)
	}
	names := make([]string, 0, len(states))
	for _, st := range states {
		switch st {
		case idempotency.StateInProgress:
			names = append(names, stateInProgress)
		case idempotency.StateFailed:
			names = append(names, stateFailed)
		case idempotency.StateCompleted:
			names = append(names, stateCompleted)
		default:
			return 0, false, wrap("delete if", key, fmt.Errorf("cannot select records in state %s", st))
		}
	}
	hash := keyHash(key)
	var state string
	err = s.pool.QueryRow(ctx, s.inspectSQL().deleteIf, hash[:], names).Scan(&state)
	switch {
	case err == nil:
		return map[string]idempotency.State{stateInProgress: idempotency.StateInProgress, stateFailed: idempotency.StateFailed,
			stateCompleted: idempotency.StateCompleted}[state], true, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return 0, false, s.queryError(ctx, "delete if", key, err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil {
		return 0, false, err
	}
	return rec.State, false, nil
}
