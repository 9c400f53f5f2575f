package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// The values of the state column.
const (
	StateInProgress = "in_progress"
	StateCompleted  = "completed"
	StateFailed     = "failed"
)

// Row is a record as the statements return it, every column nullable: a
// table made by someone else may lack the NOT NULL and CHECK constraints of
// the stores' schemas, and nothing is assumed before Check.
type Row struct {
	State       *string
	Token       []byte
	Attempts    *int64
	Fingerprint []byte
	Result      []byte
	Created     *time.Time
	Updated     *time.Time
	LeaseUntil  *time.Time
	ClaimTTL    *int64 // microseconds
	ExpiresAt   *time.Time
	Now         time.Time // the statement's clock
}

// ErrMalformed is the reason Check gives; it is only ever returned wrapped
// in idempotency.ErrCorruptRecord.
var ErrMalformed = errors.New("row violates the record's invariants")

// Check returns nil for a well-formed record and otherwise an error matching
// idempotency.ErrCorruptRecord that says what is wrong. It accepts exactly
// the rows each store's SQL test of validity holds true for; each store's
// tests keep the two in step.
func (r *Row) Check() error {
	bad := func(what string) error {
		return fmt.Errorf("%w: %w: %s", idempotency.ErrCorruptRecord, ErrMalformed, what)
	}
	switch {
	case r.State == nil:
		return bad("no state")
	case r.Attempts == nil || *r.Attempts < 1:
		return bad("attempts missing or below 1")
	case r.Created == nil || r.Updated == nil || r.ExpiresAt == nil:
		return bad("a time is missing")
	}
	switch *r.State {
	case StateInProgress:
		switch {
		case len(r.Token) == 0:
			return bad("in_progress without a token")
		case r.LeaseUntil == nil:
			return bad("in_progress without a lease")
		case r.ClaimTTL == nil || *r.ClaimTTL <= 0:
			return bad("in_progress without a positive claim TTL")
		case r.Result != nil:
			return bad("in_progress with a result")
		}
	case StateCompleted:
		switch {
		case len(r.Token) == 0:
			return bad("completed without the completing token")
		case r.LeaseUntil != nil || r.ClaimTTL != nil:
			return bad("completed with a lease")
		case r.Result == nil:
			return bad("completed without a result")
		}
	case StateFailed:
		switch {
		case r.LeaseUntil != nil || r.ClaimTTL != nil:
			return bad("failed with a lease")
		case r.Result != nil:
			return bad("failed with a result")
		}
	default:
		s := *r.State
		if len(s) > 32 {
			s = s[:32] + "…"
		}
		return bad(fmt.Sprintf("unknown state %q", s))
	}
	return nil
}

// Expired reports whether the (checked) record has expired: it then counts
// as absent.
func (r *Row) Expired() bool {
	return !r.Now.Before(*r.ExpiresAt)
}

// TTL is how long the (checked) record has left before it counts as absent.
func (r *Row) TTL() time.Duration {
	return r.ExpiresAt.Sub(r.Now)
}

// Live reports whether the (checked) record is IN_PROGRESS with a lease
// that has not lapsed.
func (r *Row) Live() bool {
	return *r.State == StateInProgress && r.Now.Before(*r.LeaseUntil)
}

// Holds reports whether token holds the (checked) record's live lease.
func (r *Row) Holds(token string) bool {
	return r.Live() && string(r.Token) == token
}

// ClaimedBy reports whether the (checked) record is IN_PROGRESS under
// token, its lease live or not: the row a claim of token left, which no
// other claim has taken over since.
func (r *Row) ClaimedBy(token string) bool {
	return *r.State == StateInProgress && string(r.Token) == token
}

// Record returns the (checked, unexpired) row as a Record; its token only if
// withToken and the lease is live. A lapsed lease reads as FAILED with its
// deadline.
func (r *Row) Record(withToken bool) idempotency.Record {
	rec := idempotency.Record{
		Attempts:    int(*r.Attempts),
		Result:      r.Result,
		Fingerprint: r.Fingerprint,
		CreatedAt:   *r.Created,
		UpdatedAt:   *r.Updated,
	}
	if len(rec.Fingerprint) == 0 {
		rec.Fingerprint = nil
	}
	switch *r.State {
	case StateInProgress:
		rec.State = idempotency.StateInProgress
		rec.LeaseExpiresAt = *r.LeaseUntil
		switch {
		case !r.Live():
			rec.State = idempotency.StateFailed // the owner stopped renewing: the attempt failed
		case withToken:
			rec.Token = string(r.Token)
		}
	case StateCompleted:
		rec.State = idempotency.StateCompleted
		if rec.Result == nil {
			rec.Result = []byte{}
		}
	case StateFailed:
		rec.State = idempotency.StateFailed
	}
	return rec
}

// Read is the stores' Get of the row, found false when there was none:
// an absent or expired row reads StateAbsent, a corrupt one is Check's
// error, any other its record, token included.
func (r *Row) Read(found bool) (idempotency.Record, error) {
	if !found {
		return idempotency.Record{State: idempotency.StateAbsent}, nil
	}
	if err := r.Check(); err != nil {
		return idempotency.Record{}, err
	}
	if r.Expired() {
		return idempotency.Record{State: idempotency.StateAbsent}, nil
	}
	return r.Record(true), nil
}

// Micros scans a column of microseconds since the Unix epoch, or NULL, into
// a time in UTC: into *T when T is set (NULL leaves nil there), else into
// *At (NULL is an error).
type Micros struct {
	T  **time.Time
	At *time.Time
}

var _ sql.Scanner = Micros{}

// Scan implements sql.Scanner.
func (m Micros) Scan(src any) error {
	var us sql.NullInt64
	if err := us.Scan(src); err != nil {
		return err
	}
	switch {
	case m.T != nil && !us.Valid:
		*m.T = nil
	case m.T != nil:
		t := time.UnixMicro(us.Int64).UTC()
		*m.T = &t
	case !us.Valid:
		return errors.New("sqlstore: NULL where a time is required")
	default:
		*m.At = time.UnixMicro(us.Int64).UTC()
	}
	return nil
}
