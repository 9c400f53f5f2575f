package pgstore

import (
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// The statements of a store, built once by New: one per transition, one
// round trip. Values travel only as parameters; the only spliced names, the
// table's and its index's, are validated and quoted. Durations are bigint
// microseconds times interval '1 microsecond', exact in any time zone. Every
// time is statement_timestamp(), the server's clock, once per statement.
type statements struct {
	claim, get, renew, complete, fail, release, del, purge string
	schema                                                 string
}

// columns is the record in the order of dest, for alias r; the last is the
// statement's clock.
const columns = `r.state, r.token, r.attempts, r.fingerprint, r.result, r.created_at, r.updated_at, r.lease_until, r.claim_ttl_us, r.expires_at, statement_timestamp()`

// fallbackColumns, for alias c, leave out the fingerprint and empty the
// result, so a resent Complete does not carry it back.
const fallbackColumns = `c.state, c.token, c.attempts, NULL::bytea, CASE WHEN c.result IS NULL THEN NULL ELSE ''::bytea END, c.created_at, c.updated_at, c.lease_until, c.claim_ttl_us, c.expires_at, statement_timestamp()`

// validSQL and checkSQL are the record's invariant (sqlstore.ValidSQL), for
// alias {r}. and for the CHECK constraint, named per table.
var validSQL = sqlstore.ValidSQL("''::bytea")

var checkSQL = sqlstore.CheckSQL("''::bytea")

const constraintName = "idempotency_record_valid"

func valid(alias string) string {
	return strings.ReplaceAll(validSQL, "{r}", alias+".")
}

// heldSQL is an owner's condition: alias r is a valid IN_PROGRESS record
// whose live lease $2 holds; a lapsed lease is nobody's.
const heldSQL = `r.key_hash = $1 AND r.state = 'in_progress' AND r.token = $2
	AND r.lease_until > statement_timestamp() AND r.expires_at > statement_timestamp() AND `

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

// schemaSQL is the table. The primary key is key_hash, the key's SHA-256:
// a B-tree entry holds at most about 2.7 kB.
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
// done answers a COMPLETED duplicate from the snapshot, with no lock or
// write: COMPLETED is terminal until expiry or deletion. Otherwise claimed
// inserts, or updates under the row lock with d.action:
//
//	keep   corrupt, another fingerprint, COMPLETED, another's live lease
//	fresh  expired: a new record, attempt 1
//	again  a live lease of $3 (a resend): the lease counts from now
//	next   FAILED, or a lapsed lease: attempt n+1 under $3
//
// The update is unconditional: with a false WHERE, ON CONFLICT returns no
// row, and the snapshot may not see a row committed after it. Writing back
// unchanged makes RETURNING give the latest row, race-free, for one row
// version per refusal.
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
// lease ({held}), and report whether they did. If not, they return the row
// from the statement's snapshot, to tell a resend, a corrupt row and a lost
// lease apart. The update judges the latest row; an older snapshot answers
// no differently for a row the token no longer holds, which stays so.
const ownerTail = `c.key_hash IS NOT NULL, {fallback}
FROM (VALUES (0)) AS one (x) LEFT JOIN {t} AS c ON c.key_hash = $1 AND NOT EXISTS (SELECT FROM applied)`

// renewSQL is Renew: $1 key_hash, $2 token, $3 lease µs.
const renewSQL = `WITH applied AS (
	UPDATE {t} AS r SET lease_until = statement_timestamp() + {micros3},
		expires_at = statement_timestamp() + {micros3} + r.claim_ttl_us * interval '1 microsecond'
	WHERE {held}
	RETURNING 1)
SELECT EXISTS (SELECT FROM applied), ` + ownerTail

// finishSQL is Complete's and Fail's statement: the row takes set, gives up
// its lease and expires ttl from now. The token stays, to recognise a resend.
func finishSQL(set, ttl string) string {
	return `WITH applied AS (
	UPDATE {t} AS r SET ` + set + `,
		updated_at = GREATEST(statement_timestamp(), r.updated_at),
		lease_until = NULL, claim_ttl_us = NULL, expires_at = statement_timestamp() + ` + ttl + `
	WHERE {held}
	RETURNING 1)
SELECT EXISTS (SELECT FROM applied), ` + ownerTail
}

// completeSQL is Complete: $1 key_hash, $2 token, $3 result (never NULL), $4 TTL µs.
var completeSQL = finishSQL(`state = 'completed', result = $3`, "{micros4}")

// failSQL is Fail: $1 key_hash, $2 token, $3 TTL µs.
var failSQL = finishSQL(`state = 'failed'`, "{micros3}")

// releaseSQL is Release: $1 key_hash, $2 token. Attempt 1 is deleted; a
// later one goes back to FAILED, one attempt fewer, kept the claim's TTL.
// At most one sub-statement matches.
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

// purgeSQL is Purge: $1 batch size. SKIP LOCKED leaves rows a claim or
// another purge holds; READ COMMITTED re-checks a locked row's expiry.
const purgeSQL = `DELETE FROM {t} WHERE key_hash IN (
	SELECT key_hash FROM {t} WHERE expires_at <= statement_timestamp()
	LIMIT $1 FOR UPDATE SKIP LOCKED)
AND expires_at <= statement_timestamp()`
