package mysqlstore

import (
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// The statements, built once by New; values travel only as parameters.
// Durations are BIGINT µs; times are UTC_TIMESTAMP(6), read back as BIGINT
// µs so no driver setting changes them. Each UPDATE value reads only
// columns assigned after it: MySQL's left-to-right SET and MariaDB's
// SIMULTANEOUS_ASSIGNMENT then agree.
type statements struct {
	claim, get, renew, complete, fail, releaseDelete, releaseUpdate string
	fallback, fallbackLocked, del, purge                            string
	schema                                                          string
}

func micros(expr string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + expr + ")"
}

// columns is the record in dest's order, for alias r, and the clock.
var columns = `r.state, r.token, r.attempts, r.fingerprint, r.result, ` +
	micros("r.created_at") + `, ` + micros("r.updated_at") + `, ` + micros("r.lease_until") +
	`, r.claim_ttl_us, ` + micros("r.expires_at") + `, ` + micros("UTC_TIMESTAMP(6)")

// fallbackColumns leaves out the fingerprint and empties the result, so a
// resent Complete does not carry it back.
var fallbackColumns = `r.state, r.token, r.attempts, NULL, IF(r.result IS NULL, NULL, ''), ` +
	micros("r.created_at") + `, ` + micros("r.updated_at") + `, ` + micros("r.lease_until") +
	`, r.claim_ttl_us, ` + micros("r.expires_at") + `, ` + micros("UTC_TIMESTAMP(6)")

// validSQL and checkSQL are the record's invariant (sqlstore.ValidSQL), on
// columns prefixed by {r}, and for the CHECK constraint. VARBINARY compares exactly.
var validSQL = sqlstore.ValidSQL("''")

var checkSQL = sqlstore.CheckSQL("''")

func valid(prefix string) string {
	return strings.ReplaceAll(validSQL, "{r}", prefix)
}

// heldSQL: a valid IN_PROGRESS record whose live lease the token holds
// (key_hash, token). TIMESTAMPDIFF keeps MariaDB from scanning expires_at,
// which under REPEATABLE READ locked its last gap and made every claim wait
// for an in-transaction completion (TestCompletionLocks).
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

// schemaSQL is the table, keyed by the key's SHA-256 (an InnoDB key holds
// 3072 bytes at most); strings are binary, compared byte for byte.
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

// claimSQL is Claim. Its decision, kept in @idempotency_claim:
//
//	0 keep   corrupt, another fingerprint, COMPLETED, another's live lease
//	1 fresh  expired: a new record, attempt 1
//	2 again  the token's live lease (a resend): the lease counts from now
//	3 next   FAILED, or a lapsed lease: attempt n+1 under the token
//
// Parameters: 1 key_hash, 2 key, 3 token, 4 fingerprint (or NULL), 5 lease,
// 6 TTL, 7 lease+TTL (µs), then 8, 9 fingerprint, 10, 11 token, 12, 13
// fingerprint, 14 lease, 15 TTL, 16 lease+TTL. The update runs under the
// row's exclusive lock; its first assignment sets the decision before any
// column changes, and later ones read it. Claim then reads the row.
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

// getSQL is Get and the claim's read: 1 key_hash. An expired row reads as absent.
const getSQL = `SELECT {columns} FROM {t} AS r WHERE r.key_hash = ?`

// The owner statements update the row only if their token holds its live
// lease ({held}). An InnoDB UPDATE tests its WHERE on the latest committed
// row, whatever the isolation level; when it changes nothing, fallbackSQL
// tells a resend, a corrupt row and a lost lease apart.

// renewSQL is Renew: 1 lease µs, 2 lease µs, 3 key_hash, 4 token.
const renewSQL = `UPDATE {t} SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
	expires_at = UTC_TIMESTAMP(6) + INTERVAL (? + claim_ttl_us) MICROSECOND
WHERE {held}`

// completeSQL is Complete: 1 result (not NULL), 2 TTL µs, 3 key_hash, 4 token.
const completeSQL = `UPDATE {t} SET state = 'completed', result = ?,
	updated_at = GREATEST(UTC_TIMESTAMP(6), updated_at),
	lease_until = NULL, claim_ttl_us = NULL, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE {held}`

// failSQL is Fail: 1 TTL µs, 2 key_hash, 3 token.
const failSQL = `UPDATE {t} SET state = 'failed',
	updated_at = GREATEST(UTC_TIMESTAMP(6), updated_at),
	lease_until = NULL, claim_ttl_us = NULL, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE {held}`

// releaseDeleteSQL and releaseUpdateSQL are Release: 1 key_hash, 2 token.
// Attempt 1 is deleted; a later one goes back to FAILED, one attempt fewer,
// kept the claim's TTL. At most one matches. expires_at reads claim_ttl_us first.
const releaseDeleteSQL = `DELETE FROM {t} WHERE {held} AND attempts = 1`

const releaseUpdateSQL = `UPDATE {t} SET state = 'failed', token = NULL, attempts = attempts - 1,
	updated_at = GREATEST(UTC_TIMESTAMP(6), updated_at), lease_until = NULL,
	expires_at = UTC_TIMESTAMP(6) + INTERVAL claim_ttl_us MICROSECOND, claim_ttl_us = NULL
WHERE {held} AND attempts > 1`

// fallbackSQL reads a refused owner statement's row: 1 key_hash. In a
// transaction, and for a renewal, it locks, to read what the UPDATE did.
const fallbackSQL = `SELECT {fallback} FROM {t} AS r WHERE r.key_hash = ?`

// deleteSQL is Delete: 1 key_hash. It removes any row, corrupt ones too.
const deleteSQL = `DELETE FROM {t} WHERE key_hash = ?`

// purgeSQL (1 batch size) locks expired rows, skipping those others hold,
// for deleteSQL. A plain DELETE … LIMIT would wait for an open transaction's
// row, and claims would queue behind the rows and gaps it locked.
const purgeSQL = `SELECT key_hash FROM {t} WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`
