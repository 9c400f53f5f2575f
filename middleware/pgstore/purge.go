package pgstore

import (
	"context"
	"fmt"
)

// Purge deletes up to batch expired records, in no particular order, and
// returns how many it deleted. Expired records already count
// as absent; Purge only reclaims their space. One call is one statement
// (a DELETE of at most batch rows found through the expiry index), so it
// holds its locks briefly; call it again while it returns batch to drain a
// backlog. Rows that a claim is reviving at that moment are skipped, and so
// are rows another Purge is deleting, so any number of processes may purge
// at once. A corrupt row is purged like any other once its expires_at has
// passed; one without an expires_at is left for an operator to Delete.
//
// Schedule it from one goroutine per process (or one process), every few
// minutes, for example:
//
//	t := time.NewTicker(5 * time.Minute)
//	defer t.Stop()
//	for {
//		for {
//			n, err := store.Purge(ctx, 1000)
//			if err != nil || n < 1000 {
//				break // log err; try again at the next tick
//			}
//		}
//		select {
//		case <-ctx.Done():
//			return
//		case <-t.C:
//		}
//	}
//
// A batch of a few thousand rows keeps each statement well under a second.
// It returns ErrInvalidBatch for a batch below 1.
func (s *Store) Purge(ctx context.Context, batch int) (int64, error) {
	if batch < 1 {
		return 0, fmt.Errorf("pgstore: purge %s: %w (got %d)", s.table, ErrInvalidBatch, batch)
	}
	tag, err := s.pool.Exec(ctx, s.sql.purge, batch)
	if err != nil {
		return 0, fmt.Errorf("pgstore: purge %s: %w", s.table, withContext(ctx, err))
	}
	return tag.RowsAffected(), nil
}
