package pgstore

import "github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"

// dest returns the scan destinations of r's columns (sql.go's columns), in
// order. [sqlstore.Row.Check] accepts exactly the rows validSQL holds true
// for; a test keeps the two in step.
func dest(r *sqlstore.Row) []any {
	return []any{&r.State, &r.Token, &r.Attempts, &r.Fingerprint, &r.Result,
		&r.Created, &r.Updated, &r.LeaseUntil, &r.ClaimTTL, &r.ExpiresAt, &r.Now}
}
