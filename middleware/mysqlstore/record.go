package mysqlstore

import (
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// dest returns columns' scan destinations; Row.Check matches validSQL (tested).
func dest(r *sqlstore.Row) []any {
	return []any{&r.State, &r.Token, &r.Attempts, &r.Fingerprint, &r.Result,
		sqlstore.Micros{T: &r.Created}, sqlstore.Micros{T: &r.Updated}, sqlstore.Micros{T: &r.LeaseUntil},
		&r.ClaimTTL, sqlstore.Micros{T: &r.ExpiresAt}, sqlstore.Micros{At: &r.Now}}
}

// claimedRecord is an acquired claim's record, even when its lease lapsed since.
func claimedRecord(r *sqlstore.Row) idempotency.Record {
	rec := r.Record(true)
	rec.State = idempotency.StateInProgress
	rec.Token = string(r.Token)
	return rec
}
