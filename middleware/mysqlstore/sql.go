package mysqlstore

import (
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// The statements of a store, built once by New for its table. Keys, tokens
// and values travel only as parameters (server-side prepared statements,
// the binary protocol), never spliced into the text; the only spliced names
// are the table's and its constraint's, which Config validation limits to
// plain identifiers and which are quoted besides.
//
// Parameters carry durations as BIGINT microseconds, added with INTERVAL ?
// MICROSECOND.
//
// Every time is UTC_TIMESTAMP(6), the server's clock in UTC: MySQL and
// MariaDB evaluate it once per statement, when the statement starts, also
// inside a longer transaction (as NOW(6), which would be in the session's
// time zone: sessions with different time_zone settings would disagree on
// every deadline, and a DST change would move them). Times are kept in
// DATETIME(6) columns, in UTC, and returned as BIGINT microseconds since the
// Unix epoch, so that no driver setting (parseTime, loc) changes what the
// store reads.
//
// Every UPDATE below assigns its columns so that each value depends only on
// columns assigned after it (or on itself): MySQL evaluates a SET list left
// to right, each assignment seeing the ones before, while MariaDB under
// SQL_MODE=SIMULTANEOUS_ASSIGNMENT evaluates every value on the old row;
// both read the same statement the same way.
type statements struct {
	claim, get, renew, complete, fail, releaseDelete, releaseUpdate string
	fallback, fallbackLocked, del, purge                            string
	schema                                                          string
}

// micros is the expression of a DATETIME(6) as BIGINT microseconds since the
// Unix epoch (the column holds UTC).
func micros(expr string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + expr + ")"
}

// columns is the record as every read returns it, in the order of row.dest,
// for the table alias r; the last column is the statement's clock.
var columns = `r.state, r.token, r.attempts, r.fingerprint, r.result, ` +
	micros("r.created_at") + `, ` + micros("r.updated_at") + `, ` + micros("r.lease_until") +
	`, r.claim_ttl_us, ` + micros("r.expires_at") + `, ` + micros("UTC_TIMESTAMP(6)")

// fallbackColumns is columns for the read that classifies a refused owner
// statement: the fingerprint is left out, and the result is reduced to an
// empty value when present, so that a resent Complete does not carry a large
// result back.
var fallbackColumns = `r.state, r.token, r.attempts, NULL, IF(r.result IS NULL, NULL, ''), ` +
	micros("r.created_at") + `, ` + micros("r.updated_at") + `, ` + micros("r.lease_until") +
	`, r.claim_ttl_us, ` + micros("r.expires_at") + `, ` + micros("UTC_TIMESTAMP(6)")

// validSQL and checkSQL are the record's invariant (see sqlstore.ValidSQL),
// on the columns prefixed by {r} (an alias and a dot, or nothing), and for
// the CHECK constraint. state and token are VARBINARY: their comparisons
// are exact (no trailing-space padding, no case folding).
var validSQL = sqlstore.ValidSQL("''")

var checkSQL = sqlstore.CheckSQL("''")

func valid(prefix string) string {
	return strings.ReplaceAll(validSQL, "{r}", prefix)
}

// heldSQL is the condition of an owner's transition on the unaliased row,
// with parameters key_hash then token: a valid IN_PROGRESS record whose live
// lease the token holds. A lapsed lease is held by nobody, even when nobody
// claimed the key since (a strict fence).
//
// The expiry is tested through TIMESTAMPDIFF, which no index can serve, on
// purpose: written as expires_at > UTC_TIMESTAMP(6), MariaDB's optimizer
// (its rowid filter) scans the expires_at index from now to its end to
// narrow the primary key's single row, and under REPEATABLE READ that scan
// locks the index's last gap until the transaction ends, so an in-transaction
// completion made every concurrent claim of every key wait for its COMMIT
// (TestCompletionLocks). The primary key alone finds the row.
const heldSQL = `key_hash = ? AND state = 'in_progress' AND token = ?
	AND TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) > 0
	AND TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) > 0 AND `

func buildStatements(table, constraint string) statements {
	r := strings.NewReplacer(
		"{t}", table,
		"{constraint}", constraint,
		"{valid}", valid(""),
		"{held}", heldSQL+valid(""),
		"{columns}", columns,
		"{fallback}", fallbackColumns,
		"{check}", checkSQL,
	)
	return statements{
		claim:          r.Replace(claimSQL),
		get:            r.Replace(getSQL),
		renew:          r.Replace(renewSQL),
		complete:       r.Replace(completeSQL),
		fail:           r.Replace(failSQL),
		releaseDelete:  r.Replace(releaseDeleteSQL),
		releaseUpdate:  r.Replace(releaseUpdateSQL),
		fallback:       r.Replace(fallbackSQL),
		fallbackLocked: r.Replace(fallbackSQL + ` LOCK IN SHARE MODE`),
		del:            r.Replace(deleteSQL),
		purge:          r.Replace(purgeSQL),
		schema:         r.Replace(schemaSQL),
	}
}

// schemaSQL is the table. key_hash, the SHA-256 of the key, is the primary
// key: keys are arbitrary bytes of any length, and an InnoDB index entry
// holds at most 3072 bytes. key keeps the key itself, for operators.
// Keys, tokens, fingerprints and results are binary strings, compared byte
// for byte; state is one too, so that a state with a trailing space or in
// another case is no state.
const schemaSQL = "CREATE TABLE IF NOT EXISTS {t} (" + `
	key_hash     BINARY(32)     NOT NULL,
	` + "`key`" + `        LONGBLOB       NOT NULL,
	state        VARBINARY(255) NOT NULL,
	token        VARBINARY(255),
	attempts     BIGINT         NOT NULL,
	fingerprint  BLOB,
	result       LONGBLOB,
	created_at   DATETIME(6)    NOT NULL,
	updated_at   DATETIME(6)    NOT NULL,
	lease_until  DATETIME(6),
	claim_ttl_us BIGINT,
	expires_at   DATETIME(6)    NOT NULL,
	PRIMARY KEY (key_hash),
	KEY expires_at (expires_at),
	CONSTRAINT {constraint} CHECK ({check})
) ENGINE=InnoDB`

// The claim's decisions, held in the session variable @idempotency_claim
// while its ON DUPLICATE KEY UPDATE runs:
//
//	0 keep   a corrupt row, a fingerprint that differs, COMPLETED, a live
//	         lease of another token: every column is written back unchanged
//	1 fresh  an expired row: overwritten by a new record, attempt 1
//	2 again  a live lease of the token (a resent claim): the lease counts
//	         from now, no new attempt, no new transition
//	3 next   FAILED, or a lapsed lease: attempt n+1 under the token
//
// claimSQL is Claim: 1 key_hash, 2 key, 3 token, 4 fingerprint (NULL for
// none), 5 lease µs, 6 TTL µs, 7 lease+TTL µs, then for the update 8 and 9
// fingerprint, 10 and 11 token, 12 and 13 fingerprint, 14 lease µs, 15 TTL
// µs, 16 lease+TTL µs.
//
// An absent key is inserted. A present one takes the update, which runs on
// the latest version of the row under its exclusive lock (InnoDB's
// duplicate-key check locks the row it finds, at any isolation level), so
// the decision cannot race with another claim. The decision is computed
// once, in the first assignment, before any column changes, and kept in
// the session variable that every later assignment reads: an ON DUPLICATE
// KEY UPDATE cannot name the row's old values once an earlier assignment
// changed them. The variable is set by every update of this statement
// before it is read, so a value left in the session by an earlier
// statement is never used.
//
// The statement cannot return the row (MySQL has no RETURNING, MariaDB none
// on this path), so Claim reads it next, with a second statement; see
// Store.Claim for why that read decides correctly.
const claimSQL = `INSERT INTO {t} (key_hash, ` + "`key`" + `, state, token, attempts, fingerprint, result,
	created_at, updated_at, lease_until, claim_ttl_us, expires_at)
VALUES (?, ?, 'in_progress', ?, 1, ?, NULL,
	UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?,
	UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
	state = IF((@idempotency_claim := CASE
		WHEN NOT {valid} THEN 0
		WHEN expires_at <= UTC_TIMESTAMP(6) THEN 1
		WHEN ? IS NOT NULL AND fingerprint <> '' AND fingerprint <> ? THEN 0
		WHEN state = 'in_progress' AND lease_until > UTC_TIMESTAMP(6) THEN IF(token = ?, 2, 0)
		WHEN state IN ('in_progress', 'failed') THEN 3
		ELSE 0 END) = 0, state, 'in_progress'),
	token = IF(@idempotency_claim IN (1, 3), ?, token),
	attempts = CASE @idempotency_claim WHEN 1 THEN 1 WHEN 3 THEN attempts + 1 ELSE attempts END,
	fingerprint = CASE @idempotency_claim WHEN 1 THEN ? WHEN 3 THEN COALESCE(?, fingerprint) ELSE fingerprint END,
	result = IF(@idempotency_claim IN (1, 3), NULL, result),
	created_at = IF(@idempotency_claim = 1, UTC_TIMESTAMP(6), created_at),
	updated_at = CASE @idempotency_claim WHEN 1 THEN UTC_TIMESTAMP(6)
		WHEN 3 THEN GREATEST(UTC_TIMESTAMP(6), updated_at) ELSE updated_at END,
	lease_until = IF(@idempotency_claim = 0, lease_until, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
	claim_ttl_us = IF(@idempotency_claim = 0, claim_ttl_us, ?),
	expires_at = IF(@idempotency_claim = 0, expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`

// getSQL is Get, and the claim's read: 1 key_hash. An expired row is
// returned, and read as absent.
const getSQL = `SELECT {columns} FROM {t} AS r WHERE r.key_hash = ?`

// The owner statements update the row only if their token holds its live
// lease ({held}); the number of rows they changed says whether they did.
// When they did not, fallbackSQL reads the row, to tell a resent Complete or
// Fail (nil), a corrupt row (ErrCorruptRecord) and a lost lease apart. An
// UPDATE is a locking read in InnoDB: whatever the isolation level, it
// waits for a concurrent writer of the row and then tests its WHERE on the
// latest committed version, never on the transaction's snapshot.

// renewSQL is Renew: 1 lease µs, 2 lease µs, 3 key_hash, 4 token. The record
// keeps its claim's TTL after the new deadline.
const renewSQL = `UPDATE {t} SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
	expires_at = UTC_TIMESTAMP(6) + INTERVAL (? + claim_ttl_us) MICROSECOND
WHERE {held}`

// completeSQL is Complete: 1 result (never NULL), 2 TTL µs, 3 key_hash,
// 4 token. The token stays in the row: it recognises a resent Complete.
const completeSQL = `UPDATE {t} SET state = 'completed', result = ?,
	updated_at = GREATEST(UTC_TIMESTAMP(6), updated_at),
	lease_until = NULL, claim_ttl_us = NULL, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE {held}`

// failSQL is Fail: 1 TTL µs, 2 key_hash, 3 token.
const failSQL = `UPDATE {t} SET state = 'failed',
	updated_at = GREATEST(UTC_TIMESTAMP(6), updated_at),
	lease_until = NULL, claim_ttl_us = NULL, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE {held}`

// releaseDeleteSQL and releaseUpdateSQL are Release: 1 key_hash, 2 token. A
// first attempt's row is deleted; a later attempt's goes back to FAILED with
// one attempt fewer and no token, kept for the claim's TTL from now. The
// two conditions exclude each other, so at most one of the two touches the
// row. expires_at is assigned before claim_ttl_us, which it reads.
const releaseDeleteSQL = `DELETE FROM {t} WHERE {held} AND attempts = 1`

const releaseUpdateSQL = `UPDATE {t} SET state = 'failed', token = NULL, attempts = attempts - 1,
	updated_at = GREATEST(UTC_TIMESTAMP(6), updated_at), lease_until = NULL,
	expires_at = UTC_TIMESTAMP(6) + INTERVAL claim_ttl_us MICROSECOND, claim_ttl_us = NULL
WHERE {held} AND attempts > 1`

// fallbackSQL reads the row of a refused owner statement: 1 key_hash. In a
// transaction (CompleteInTx), and for a renewal, it is a locking read (LOCK
// IN SHARE MODE), so that it sees the latest committed version, as the
// UPDATE did, rather than a snapshot: a renewal that waited for an
// in-transaction completion must see its COMMIT (Store.Renew).
const fallbackSQL = `SELECT {fallback} FROM {t} AS r WHERE r.key_hash = ?`

// deleteSQL is Delete: 1 key_hash. It removes any row, corrupt ones too.
const deleteSQL = `DELETE FROM {t} WHERE key_hash = ?`

// purgeSQL is a purge's first statement, in a READ COMMITTED transaction
// (1 batch size): it locks up to a batch of expired rows, skipping the
// rows others hold locked (a claim reviving one, another purge, an open
// in-transaction completion); deleteSQL then deletes each.
// The locking read tests the expiry on the row's latest version, so a row
// that a claim revived is not taken; a claim that waits for the purge's
// lock then finds no row and inserts a new one, attempt 1, as it would for
// any expired row. A plain DELETE … ORDER BY expires_at LIMIT would wait
// for a row an open transaction holds (the first live one its scan
// reaches), holding the expired rows and, under REPEATABLE READ, the gaps
// it had locked: every claim of those keys, and of new keys whose expiry
// falls in the gaps, would queue behind that transaction.
const purgeSQL = `SELECT key_hash FROM {t} WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`
