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

// ErrInvalidBatch is PurgeEvery's error for a batch below 1.
var ErrInvalidBatch = errors.New("purge batch must be positive")

// PurgeEvery calls purge at once and then every interval until ctx ends, and
// returns nil then. Each round calls purge again while it returns a full
// batch, so that a backlog drains within one round. A failing call is
// logged at Error and ends the round; the next round tries again. A round
// that deleted rows is logged at Debug. It returns an error at once, and
// purges nothing, for a batch below 1 or an interval below 1 ns.
func PurgeEvery(ctx context.Context, interval time.Duration, batch int, purge func(ctx context.Context, batch int) (int64, error), logger watermill.LoggerAdapter, table string) error {
	if batch < 1 {
		return fmt.Errorf("%w (got %d)", ErrInvalidBatch, batch)
	}
	if interval <= 0 {
		return fmt.Errorf("%w (got %s)", ErrInvalidInterval, interval)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var total int64
		for ctx.Err() == nil {
			n, err := purge(ctx, batch)
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
