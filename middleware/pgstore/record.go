package pgstore

import "github.com/idempotency/watermill-idempotency/middleware/internal/sqlrecord"

// The values of the state column.
const (
	stateInProgress = sqlrecord.StateInProgress
	stateCompleted  = sqlrecord.StateCompleted
	stateFailed     = sqlrecord.StateFailed
)

// row is a record as the statements return it (sql.go's columns); its
// checks and its reading are sqlrecord's, shared with mysqlstore. Check
// accepts exactly the rows validSQL (sql.go) holds true for; a test keeps
// the two in step.
type row struct{ sqlrecord.Row }

// dest returns the scan destinations of the columns, in order.
func (r *row) dest() []any {
	return []any{&r.State, &r.Token, &r.Attempts, &r.Fingerprint, &r.Result,
		&r.Created, &r.Updated, &r.LeaseUntil, &r.ClaimTTL, &r.ExpiresAt, &r.Now}
}
