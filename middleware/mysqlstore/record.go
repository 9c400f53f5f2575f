package mysqlstore

import (
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlrecord"
)

// The values of the state column.
const (
	stateInProgress = sqlrecord.StateInProgress
	stateCompleted  = sqlrecord.StateCompleted
	stateFailed     = sqlrecord.StateFailed
)

// row is a record as the statements return it (sql.go's columns, whose
// times are microseconds since the Unix epoch); its checks and its reading
// are sqlrecord's, shared with pgstore. Check accepts exactly the rows
// validSQL (sql.go) holds true for; a test keeps the two in step.
type row struct{ sqlrecord.Row }

// dest returns the scan destinations of the columns, in order.
func (r *row) dest() []any {
	return []any{&r.State, &r.Token, &r.Attempts, &r.Fingerprint, &r.Result,
		sqlrecord.Micros{T: &r.Created}, sqlrecord.Micros{T: &r.Updated}, sqlrecord.Micros{T: &r.LeaseUntil},
		&r.ClaimTTL, sqlrecord.Micros{T: &r.ExpiresAt}, sqlrecord.Micros{At: &r.Now}}
}

// claimedRecord is the record of a claim that acquired the (checked) row:
// IN_PROGRESS with its token, also when its lease lapsed since the claim
// wrote it.
func (r *row) claimedRecord() idempotency.Record {
	rec := r.Record(true)
	rec.State = idempotency.StateInProgress
	rec.Token = string(r.Token)
	return rec
}
