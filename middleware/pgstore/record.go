package pgstore

import "github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"

// dest returns the scan destinations of columns. [sqlstore.Row.Check]
// accepts exactly the rows validSQL holds; a test keeps them in step.
func dest(r *sqlstore.Row) []any {
	return []any{&r.State, &r.Token, &r.Attempts, &r.Fingerprint, &r.Result,
		&r.Created, &r.Updated, &r.LeaseUntil, &r.ClaimTTL, &r.ExpiresAt, &r.Now}
}
