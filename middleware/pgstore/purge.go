package pgstore

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// PurgeEvery deletes expired records at once and then every interval,
// until ctx ends; it returns nil then. Run it in one goroutine per process:
//
//	go func() { _ = store.PurgeEvery(ctx, 5*time.Minute, 1000, logger) }()
//
// Expired records already read as absent; purging reclaims their space.
// Each round deletes batch rows per statement while batches come back
// full, skipping locked rows, so any number of processes may purge at once.
// A failed round is logged at Error (a nil logger logs nothing) and retried
// at the next. A batch below 1 or an interval below 1 ns is an error at once.
func (s *Store) PurgeEvery(ctx context.Context, interval time.Duration, batch int, logger watermill.LoggerAdapter) error {
	return s.d.PurgeEvery(ctx, interval, batch, logger)
}
