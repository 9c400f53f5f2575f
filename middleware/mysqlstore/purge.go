package mysqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idempotency/watermill-idempotency/middleware/internal/purgeloop"
)

// Purge deletes up to batch expired records, oldest expiry first, and
// returns how many it deleted. Expired records already count as absent;
// Purge only reclaims their space. One call is one statement (a DELETE …
// ORDER BY expires_at LIMIT batch, found through the expires_at index), so
// it holds its locks briefly; call it again while it returns batch to drain
// a backlog. InnoDB re-tests the expiry on each row it locks, so a row that
// a claim revived meanwhile is not deleted; a claim that meets a row being
// purged waits for the DELETE and then starts afresh (attempt 1), as it
// would on the expired row. Any number of processes may purge at once. A
// corrupt row is purged like any other once its expires_at has passed.
//
// Under REPEATABLE READ (InnoDB's default) the DELETE also locks the gaps
// of the expires_at index it scans, until it ends: an insert whose expiry
// falls just after the last purged row's waits for it. A session at READ
// COMMITTED takes no gap locks; a batch of a few thousand rows keeps each
// statement well under a second either way.
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
// It returns ErrInvalidBatch for a batch below 1.
func (s *Store) Purge(ctx context.Context, batch int) (int64, error) {
	if batch < 1 {
		return 0, fmt.Errorf("mysqlstore: purge %s: %w (got %d)", s.table, ErrInvalidBatch, batch)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("mysqlstore: purge %s: %w", s.table, err)
	}
	res, err := dbRunner{s}.exec(ctx, s.sql.purge, batch)
	if err != nil {
		return 0, fmt.Errorf("mysqlstore: purge %s: %w", s.table, withContext(ctx, err))
	}
	return res.RowsAffected()
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
		return fmt.Errorf("mysqlstore: purge %s: %w (got %d)", s.table, ErrInvalidBatch, batch)
	}
	if err := purgeloop.Run(ctx, interval, batch, s.Purge, logger, s.table); err != nil {
		return fmt.Errorf("mysqlstore: purge %s: %w", s.table, err)
	}
	return nil
}
