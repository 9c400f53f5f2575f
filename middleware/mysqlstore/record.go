package mysqlstore

import (
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// dest returns the scan destinations of r's columns (sql.go's columns,
// whose times are microseconds since the Unix epoch), in order.
// [sqlstore.Row.Check] accepts exactly the rows validSQL holds true for; a
// test keeps the two in step.
func dest(r *sqlstore.Row) []any {
	return []any{&r.State, &r.Token, &r.Attempts, &r.Fingerprint, &r.Result,
		sqlstore.Micros{T: &r.Created}, sqlstore.Micros{T: &r.Updated}, sqlstore.Micros{T: &r.LeaseUntil},
		&r.ClaimTTL, sqlstore.Micros{T: &r.ExpiresAt}, sqlstore.Micros{At: &r.Now}}
}

// claimedRecord is the record of a claim that acquired the (checked) row:
// IN_PROGRESS with its token, also when its lease lapsed since the claim
// wrote it.
func claimedRecord(r *sqlstore.Row) idempotency.Record {
	rec := r.Record(true)
	rec.State = idempotency.StateInProgress
	rec.Token = string(r.Token)
	return rec
}
