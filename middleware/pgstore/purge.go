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
// Each round deletes batch rows per statement, again while a batch comes
// back full. Rows a claim is reviving, or another purge deleting, are
// skipped, so any number of processes may purge at once. A failed round is
// logged at Error (a nil logger logs nothing) and retried at the next. It
// returns an error at once for a batch below 1 or an interval below 1 ns.
// A batch of a few thousand keeps each statement well under a second.
func (s *Store) PurgeEvery(ctx context.Context, interval time.Duration, batch int, logger watermill.LoggerAdapter) error {
	return s.d.PurgeEvery(ctx, interval, batch, logger)
}
