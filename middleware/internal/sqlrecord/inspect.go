package sqlrecord

import (
	"iter"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// Inspected is the stores' Inspect of the scanned row r, whose size is
// size: a corrupt row is Check's error, with its size; an expired row reads
// absent, with zero TTL and size; any other is its record, token included,
// with its TTL and size. A key without a row is the store's to answer
// (absent), as only its driver tells that no row was found.
func (r *Row) Inspected(size int64) (rec idempotency.Record, ttl time.Duration, bytes int64, err error) {
	if err := r.Check(); err != nil {
		return rec, 0, size, err
	}
	if r.Expired() {
		return idempotency.Record{State: idempotency.StateAbsent}, 0, 0, nil
	}
	return r.Record(true), r.TTL(), size, nil
}

// Listed is a row of the stores' Records: its record, token included, and
// its TTL, or Check's error for a corrupt row. It does not test expiry: the
// page statement leaves expired rows out on the server's clock, which is
// the row's Now.
func (r *Row) Listed() (rec idempotency.Record, ttl time.Duration, err error) {
	if err := r.Check(); err != nil {
		return rec, 0, err
	}
	return r.Record(true), r.TTL(), nil
}

// Pages walks a keyset pagination of batch rows a page, as the stores'
// Records do: read returns the rows whose key_hash is above after (empty
// for the first page) and the last row's key_hash. Each page is read to its
// end, its rows closed, before any of it is yielded, so no query is open
// while the caller's loop runs. A read's error is yielded and ends the
// walk; a page shorter than batch is the last.
func Pages[E any](batch int, read func(after []byte) (page []E, last []byte, err error)) iter.Seq2[E, error] {
	return func(yield func(E, error) bool) {
		after := []byte{}
		for {
			page, last, err := read(after)
			if err != nil {
				var zero E
				yield(zero, err)
				return
			}
			for _, e := range page {
				if !yield(e, nil) {
					return
				}
			}
			if len(page) < batch {
				return
			}
			after = last
		}
	}
}
