package pgstore

import (
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// The statements of a store, built once by New for its table. Each
// transition is one of them: one statement, one round trip, atomic on the
// server. Keys, tokens and values travel only as parameters, never spliced
// into the text; the only spliced names are the table's and its index's,
// which Config validation limits to plain identifiers and which are quoted
// besides.
//
// Parameters carry durations as bigint microseconds, turned into intervals by
// multiplying interval '1 microsecond': an interval of pure time (no days or
// months), so adding it to a timestamptz moves it by exactly that many
// microseconds whatever the session's time zone.
//
// Every time is statement_timestamp(), the server's clock: one reading per
// statement (it is STABLE), taken when the statement arrives, also inside a
// longer transaction (where now() would be the transaction's start).
type statements struct {
	claim, get, renew, complete, fail, release, del, purge string
	schema                                                 string
}

// columns is the record as every statement returns it, in the order of
// row.dest, for the table alias r; the last column is the statement's clock.
const columns = `r.state, r.token, r.attempts, r.fingerprint, r.result, r.created_at, r.updated_at, r.lease_until, r.claim_ttl_us, r.expires_at, statement_timestamp()`

// fallbackColumns is columns for the alias c of an owner statement's
// fallback row, which only classifies a refusal: the fingerprint is left
// out, and the result is reduced to an empty value when present, so that a
// resent Complete does not carry a large result back.
const fallbackColumns = `c.state, c.token, c.attempts, NULL::bytea, CASE WHEN c.result IS NULL THEN NULL ELSE ''::bytea END, c.created_at, c.updated_at, c.lease_until, c.claim_ttl_us, c.expires_at, statement_timestamp()`

// validSQL and checkSQL are the record's invariant (see sqlstore.ValidSQL),
// for the alias {r}. and for the CHECK constraint.
var validSQL = sqlstore.ValidSQL("''::bytea")

var checkSQL = sqlstore.CheckSQL("''::bytea")

// constraintName names the CHECK constraint of validSQL. Constraint names
// are per table, so every table can use the same one.
const constraintName = "idempotency_record_valid"

func valid(alias string) string {
	return strings.ReplaceAll(validSQL, "{r}", alias+".")
}

// heldSQL is the condition of an owner's transition: the alias r is a valid
// IN_PROGRESS record whose live lease $2 holds. A lapsed lease is held by
// nobody, even when nobody claimed the key since (a strict fence).
const heldSQL = `r.key_hash = $1 AND r.state = 'in_progress' AND r.token = $2
	AND r.lease_until > statement_timestamp() AND r.expires_at > statement_timestamp() AND `

// intervalOf is the interval of the bigint microseconds parameter p.
func intervalOf(p string) string {
	return "(" + p + "::bigint * interval '1 microsecond')"
}

func buildStatements(table, index string) statements {
	r := strings.NewReplacer(
		"{t}", table,
		"{index}", index,
		"{valid_r}", valid("r"),
		"{held}", heldSQL+valid("r"),
		"{columns}", columns,
		"{fallback}", fallbackColumns,
		"{check}", checkSQL,
		"{constraint}", constraintName,
		"{lease}", intervalOf("$4"),
		"{lease_ttl}", intervalOf("($4::bigint + $5::bigint)"),
		"{micros3}", intervalOf("$3"),
		"{micros4}", intervalOf("$4"),
	)
	return statements{
		claim:    r.Replace(claimSQL),
		get:      r.Replace(getSQL),
		renew:    r.Replace(renewSQL),
		complete: r.Replace(completeSQL),
		fail:     r.Replace(failSQL),
		release:  r.Replace(releaseSQL),
		del:      r.Replace(deleteSQL),
		purge:    r.Replace(purgeSQL),
		schema:   r.Replace(schemaSQL),
	}
}

// schemaSQL is the table. key_hash, the SHA-256 of the key, is the primary
// key: keys are arbitrary bytes of any length, and a B-tree entry cannot
// exceed about 2.7 kB. key keeps the key itself, for operators.
const schemaSQL = `CREATE TABLE IF NOT EXISTS {t} (
	key_hash     bytea       PRIMARY KEY,
	key          bytea       NOT NULL,
	state        text        NOT NULL,
	token        bytea,
	attempts     integer     NOT NULL,
	fingerprint  bytea,
	result       bytea,
	created_at   timestamptz NOT NULL,
	updated_at   timestamptz NOT NULL,
	lease_until  timestamptz,
	claim_ttl_us bigint,
	expires_at   timestamptz NOT NULL,
	CONSTRAINT {constraint} CHECK ({check})
);
CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at);
`

// claimSQL is Claim: $1 key_hash, $2 key, $3 token, $4 lease µs, $5 TTL µs,
// $6 fingerprint (NULL for none).
//
// done: a duplicate of a COMPLETED key, the commonest refusal, is answered
// from the statement's snapshot, with no lock and no write. COMPLETED is
// terminal until the row expires or is deleted, so the snapshot's version is
// the key's state at a moment within the call.
//
// claimed: otherwise an absent key is inserted, and a present one is always
// updated; the update decides, on the latest version of the row and under
// its row lock, what the claim does (d.action):
//
//	keep   a corrupt row, a fingerprint that differs, COMPLETED, a live
//	       lease of another token: every column is written back unchanged
//	fresh  an expired row: overwritten by a new record, attempt 1
//	again  a live lease of $3 (a resent claim): the lease counts from now,
//	       no new attempt, no new transition
//	next   FAILED, or a lapsed lease: attempt n+1 under $3
//
// The update is unconditional on purpose: an ON CONFLICT DO UPDATE whose
// WHERE is false returns no row, and the statement's snapshot cannot supply
// it (under READ COMMITTED, a row inserted by a claim that committed after
// the snapshot was taken is invisible to it, yet is the row that refused the
// claim). Writing the row back unchanged makes RETURNING give the latest
// version in every case: one statement, race-free. It costs a row version
// per refusal that is not a COMPLETED duplicate, which such a refusal would
// pay in WAL anyway (ON CONFLICT locks the row, and the lock is logged).
const claimSQL = `WITH done AS (
	SELECT {columns} FROM {t} AS r
	WHERE r.key_hash = $1 AND r.state = 'completed' AND r.expires_at > statement_timestamp() AND {valid_r}),
claimed AS (
INSERT INTO {t} AS r (key_hash, key, state, token, attempts, fingerprint, result,
	created_at, updated_at, lease_until, claim_ttl_us, expires_at)
SELECT $1::bytea, $2::bytea, 'in_progress', $3::bytea, 1, $6::bytea, NULL::bytea,
	statement_timestamp(), statement_timestamp(), statement_timestamp() + {lease}, $5::bigint, statement_timestamp() + {lease_ttl}
WHERE NOT EXISTS (SELECT FROM done)
ON CONFLICT (key_hash) DO UPDATE SET
	(state, token, attempts, fingerprint, result, created_at, updated_at, lease_until, claim_ttl_us, expires_at) = (
	SELECT
		CASE WHEN d.action = 'keep' THEN r.state ELSE 'in_progress' END,
		CASE WHEN d.action IN ('fresh', 'next') THEN $3 ELSE r.token END,
		CASE d.action WHEN 'fresh' THEN 1 WHEN 'next' THEN r.attempts + 1 ELSE r.attempts END,
		CASE d.action WHEN 'fresh' THEN $6 WHEN 'next' THEN COALESCE($6, r.fingerprint) ELSE r.fingerprint END,
		CASE WHEN d.action IN ('fresh', 'next') THEN NULL ELSE r.result END,
		CASE WHEN d.action = 'fresh' THEN statement_timestamp() ELSE r.created_at END,
		CASE d.action WHEN 'fresh' THEN statement_timestamp()
			WHEN 'next' THEN GREATEST(statement_timestamp(), r.updated_at) ELSE r.updated_at END,
		CASE WHEN d.action = 'keep' THEN r.lease_until ELSE statement_timestamp() + {lease} END,
		CASE WHEN d.action = 'keep' THEN r.claim_ttl_us ELSE $5 END,
		CASE WHEN d.action = 'keep' THEN r.expires_at ELSE statement_timestamp() + {lease_ttl} END
	FROM (SELECT CASE
		WHEN NOT {valid_r} THEN 'keep'
		WHEN r.expires_at <= statement_timestamp() THEN 'fresh'
		WHEN $6 IS NOT NULL AND r.fingerprint <> ''::bytea AND r.fingerprint <> $6 THEN 'keep'
		WHEN r.state = 'in_progress' AND r.lease_until > statement_timestamp() THEN
			CASE WHEN r.token = $3 THEN 'again' ELSE 'keep' END
		WHEN r.state IN ('in_progress', 'failed') THEN 'next'
		ELSE 'keep' END AS action) AS d)
RETURNING {columns})
SELECT * FROM done UNION ALL SELECT * FROM claimed`

// getSQL is Get: $1 key_hash. An expired row is returned, and read as absent.
const getSQL = `SELECT {columns} FROM {t} AS r WHERE r.key_hash = $1`

// The owner statements update the row only if their token holds its live
// lease ({held}), and report whether they did. When they did not, they also
// return the row as the statement's snapshot has it, to tell a resent
// Complete or Fail (nil), a corrupt row (ErrCorruptRecord) and a lost lease
// apart. The update decides on the latest version of the row (READ
// COMMITTED re-checks its WHERE after waiting for a concurrent writer); the
// snapshot's version may be older, which only matters for rows that the
// token can no longer hold, and for which an older version answers no
// differently: a COMPLETED or FAILED record of this token's stays so until
// it expires or is deleted, and a corrupt row is never rewritten.
const ownerTail = `c.key_hash IS NOT NULL, {fallback}
FROM (VALUES (0)) AS one (x) LEFT JOIN {t} AS c ON c.key_hash = $1 AND NOT EXISTS (SELECT FROM applied)`

// renewSQL is Renew: $1 key_hash, $2 token, $3 lease µs. The record keeps
// its claim's TTL after the new deadline.
const renewSQL = `WITH applied AS (
	UPDATE {t} AS r SET lease_until = statement_timestamp() + {micros3},
		expires_at = statement_timestamp() + {micros3} + r.claim_ttl_us * interval '1 microsecond'
	WHERE {held}
	RETURNING 1)
SELECT EXISTS (SELECT FROM applied), ` + ownerTail

// finishSQL is the statement of Complete and Fail: the owner's row takes
// set (its new state, and what comes with it), gives up its lease and
// expires ttl from now. The token stays in the row: it recognises a resent
// Complete or Fail.
func finishSQL(set, ttl string) string {
	return `WITH applied AS (
	UPDATE {t} AS r SET ` + set + `,
		updated_at = GREATEST(statement_timestamp(), r.updated_at),
		lease_until = NULL, claim_ttl_us = NULL, expires_at = statement_timestamp() + ` + ttl + `
	WHERE {held}
	RETURNING 1)
SELECT EXISTS (SELECT FROM applied), ` + ownerTail
}

// completeSQL is Complete: $1 key_hash, $2 token, $3 result (never NULL),
// $4 TTL µs.
var completeSQL = finishSQL(`state = 'completed', result = $3`, "{micros4}")

// failSQL is Fail: $1 key_hash, $2 token, $3 TTL µs.
var failSQL = finishSQL(`state = 'failed'`, "{micros3}")

// releaseSQL is Release: $1 key_hash, $2 token. A first attempt's row is
// deleted; a later attempt's goes back to FAILED with one attempt fewer and
// no token, kept for the claim's TTL from now. The two conditions exclude
// each other, so at most one of the two sub-statements touches the row.
const releaseSQL = `WITH gone AS (
	DELETE FROM {t} AS r WHERE {held} AND r.attempts = 1
	RETURNING 1),
undone AS (
	UPDATE {t} AS r SET state = 'failed', token = NULL, attempts = r.attempts - 1,
		updated_at = GREATEST(statement_timestamp(), r.updated_at), lease_until = NULL, claim_ttl_us = NULL,
		expires_at = statement_timestamp() + r.claim_ttl_us * interval '1 microsecond'
	WHERE {held} AND r.attempts > 1
	RETURNING 1),
applied AS (SELECT FROM gone UNION ALL SELECT FROM undone)
SELECT EXISTS (SELECT FROM applied), ` + ownerTail

// deleteSQL is Delete: $1 key_hash. It removes any row, corrupt ones too.
const deleteSQL = `DELETE FROM {t} WHERE key_hash = $1`

// purgeSQL is Purge: $1 batch size. SKIP LOCKED leaves rows that a claim is
// taking over (or another purge is deleting) to them; the row lock then
// keeps a row a claim revived after the subquery saw it from being deleted,
// since READ COMMITTED re-checks the locked row's expiry.
const purgeSQL = `DELETE FROM {t} WHERE key_hash IN (
	SELECT key_hash FROM {t} WHERE expires_at <= statement_timestamp()
	LIMIT $1 FOR UPDATE SKIP LOCKED)
AND expires_at <= statement_timestamp()`
