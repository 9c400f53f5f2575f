package mysqlstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// The values of the state column.
const (
	stateInProgress = "in_progress"
	stateCompleted  = "completed"
	stateFailed     = "failed"
)

// row is a record as the statements return it (sql.go's columns), every
// column nullable: a table made by someone else may lack the NOT NULL and
// CHECK constraints of Schema, and nothing is assumed before check.
type row struct {
	state       *string
	token       []byte
	attempts    *int64
	fingerprint []byte
	result      []byte
	created     *int64 // microseconds since the Unix epoch, as all times
	updated     *int64
	leaseUntil  *int64
	claimTTL    *int64 // microseconds
	expiresAt   *int64
	now         int64 // the statement's clock
}

// dest returns the scan destinations of the columns, in order.
func (r *row) dest() []any {
	return []any{&r.state, &r.token, &r.attempts, &r.fingerprint, &r.result,
		&r.created, &r.updated, &r.leaseUntil, &r.claimTTL, &r.expiresAt, &r.now}
}

// errMalformed is the reason check gives; it is only ever returned wrapped in
// idempotency.ErrCorruptRecord.
var errMalformed = errors.New("row violates the record's invariants")

// check returns nil for a well-formed record and otherwise an error matching
// idempotency.ErrCorruptRecord that says what is wrong. It accepts exactly the
// rows validSQL (sql.go) holds true for; a test keeps the two in step.
func (r *row) check() error {
	bad := func(what string) error {
		return fmt.Errorf("%w: %w: %s", idempotency.ErrCorruptRecord, errMalformed, what)
	}
	switch {
	case r.state == nil:
		return bad("no state")
	case r.attempts == nil || *r.attempts < 1:
		return bad("attempts missing or below 1")
	case r.created == nil || r.updated == nil || r.expiresAt == nil:
		return bad("a time is missing")
	}
	switch *r.state {
	case stateInProgress:
		switch {
		case len(r.token) == 0:
			return bad("in_progress without a token")
		case r.leaseUntil == nil:
			return bad("in_progress without a lease")
		case r.claimTTL == nil || *r.claimTTL <= 0:
			return bad("in_progress without a positive claim TTL")
		case r.result != nil:
			return bad("in_progress with a result")
		}
	case stateCompleted:
		switch {
		case len(r.token) == 0:
			return bad("completed without the completing token")
		case r.leaseUntil != nil || r.claimTTL != nil:
			return bad("completed with a lease")
		case r.result == nil:
			return bad("completed without a result")
		}
	case stateFailed:
		switch {
		case r.leaseUntil != nil || r.claimTTL != nil:
			return bad("failed with a lease")
		case r.result != nil:
			return bad("failed with a result")
		}
	default:
		s := *r.state
		if len(s) > 32 {
			s = s[:32] + "…"
		}
		return bad(fmt.Sprintf("unknown state %q", s))
	}
	return nil
}

// expired reports whether the (checked) record has expired: it then counts as
// absent.
func (r *row) expired() bool {
	return r.now >= *r.expiresAt
}

// live reports whether the (checked) record is IN_PROGRESS with a lease that
// has not lapsed.
func (r *row) live() bool {
	return *r.state == stateInProgress && r.now < *r.leaseUntil
}

// record returns the (checked, unexpired) row as a Record; its token only if
// withToken and the lease is live. A lapsed lease reads as FAILED with its
// deadline.
func (r *row) record(withToken bool) idempotency.Record {
	rec := idempotency.Record{
		Attempts:    int(*r.attempts),
		Result:      r.result,
		Fingerprint: r.fingerprint,
		CreatedAt:   timeOf(*r.created),
		UpdatedAt:   timeOf(*r.updated),
	}
	if len(rec.Fingerprint) == 0 {
		rec.Fingerprint = nil
	}
	switch *r.state {
	case stateInProgress:
		rec.State = idempotency.StateInProgress
		rec.LeaseExpiresAt = timeOf(*r.leaseUntil)
		switch {
		case !r.live():
			rec.State = idempotency.StateFailed // the owner stopped renewing: the attempt failed
		case withToken:
			rec.Token = string(r.token)
		}
	case stateCompleted:
		rec.State = idempotency.StateCompleted
		if rec.Result == nil {
			rec.Result = []byte{}
		}
	case stateFailed:
		rec.State = idempotency.StateFailed
	}
	return rec
}

// timeOf is the time of microseconds since the Unix epoch, in UTC.
func timeOf(us int64) time.Time { return time.UnixMicro(us).UTC() }

// ttl is how long the (checked) record has left before it counts as absent.
func (r *row) ttl() time.Duration {
	return time.Duration(*r.expiresAt-r.now) * time.Microsecond
}

// claimedBy reports whether the (checked) record is IN_PROGRESS under
// token, its lease live or not: the row a claim of token left, which no
// other claim has taken over since.
func (r *row) claimedBy(token string) bool {
	return *r.state == stateInProgress && string(r.token) == token
}

// claimedRecord is the record of a claim that acquired the (checked) row:
// IN_PROGRESS with its token, also when its lease lapsed since the claim
// wrote it.
func (r *row) claimedRecord() idempotency.Record {
	rec := r.record(true)
	rec.State = idempotency.StateInProgress
	rec.Token = string(r.token)
	return rec
}
