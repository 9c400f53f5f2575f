package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/internal/purgeloop"
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

// PurgeEvery runs Purge(ctx, batch) at once and then every interval until
// ctx ends, and returns nil then: the loop of Purge's documentation, for
// one goroutine per process:
//
//	go func() { _ = store.PurgeEvery(ctx, 5*time.Minute, 1000, logger) }()
//
// Each round purges again while a full batch was deleted, so that a
// backlog drains at once. A failing round is logged at Error (a nil logger
// logs nothing) and the next round tries again, so a database that is
// down for a while loses nothing. It returns at once, having purged
// nothing, ErrInvalidBatch for a batch below 1 and an error for an interval
// below 1 ns.
func (s *Store) PurgeEvery(ctx context.Context, interval time.Duration, batch int, logger watermill.LoggerAdapter) error {
	if batch < 1 {
		return fmt.Errorf("pgstore: purge %s: %w (got %d)", s.table, ErrInvalidBatch, batch)
	}
	if err := purgeloop.Run(ctx, interval, batch, s.Purge, logger, s.table); err != nil {
		return fmt.Errorf("pgstore: purge %s: %w", s.table, err)
	}
	return nil
}
