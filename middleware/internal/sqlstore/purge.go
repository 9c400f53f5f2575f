package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// ErrInvalidInterval is PurgeEvery's error for an interval below 1 ns.
var ErrInvalidInterval = errors.New("purge interval must be positive")

// ErrInvalidBatch is Purge's error for a batch below 1.
var ErrInvalidBatch = errors.New("purge batch must be positive")

// Purge is one purge of up to batch expired rows by the store named pkg
// (for errors) on table: ErrInvalidBatch for a batch below 1, the
// context's error when it has ended, else what purge deleted.
func Purge(ctx context.Context, pkg, table string, batch int, purge func(ctx context.Context, batch int) (int64, error)) (int64, error) {
	if batch < 1 {
		return 0, fmt.Errorf("%s: purge %s: %w (got %d)", pkg, table, ErrInvalidBatch, batch)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%s: purge %s: %w", pkg, table, err)
	}
	n, err := purge(ctx, batch)
	if err != nil {
		return 0, fmt.Errorf("%s: purge %s: %w", pkg, table, WithContext(ctx, err))
	}
	return n, nil
}

// PurgeEvery is the stores' PurgeEvery: it runs Purge at once and then
// every interval until ctx ends, and returns nil then. Each round purges
// again while a batch comes back full, so that a backlog drains within one
// round. A failing purge is logged at Error and ends the round; the next
// round tries again. A round that deleted rows is logged at Debug. It
// returns an error at once, and purges nothing, for a batch below 1 or an
// interval below 1 ns.
func PurgeEvery(ctx context.Context, pkg, table string, interval time.Duration, batch int, purge func(ctx context.Context, batch int) (int64, error), logger watermill.LoggerAdapter) error {
	if batch < 1 {
		return fmt.Errorf("%s: purge %s: %w (got %d)", pkg, table, ErrInvalidBatch, batch)
	}
	if interval <= 0 {
		return fmt.Errorf("%s: purge %s: %w (got %s)", pkg, table, ErrInvalidInterval, interval)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var total int64
		for ctx.Err() == nil {
			n, err := Purge(ctx, pkg, table, batch, purge)
			total += n
			if err != nil {
				if ctx.Err() == nil {
					logger.Error("Purge failed; trying again at the next round", err, watermill.LogFields{"table": table})
				}
				break
			}
			if n < int64(batch) {
				break
			}
		}
		if total > 0 {
			logger.Debug("Purged expired records", watermill.LogFields{"table": table, "deleted": total})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
