package rediskeys

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Delete deletes the keys of c that match pattern (a SCAN MATCH glob),
// SCANning and UNLINKing a thousand at a time. It never flushes: the shared
// server holds other keys. It returns the first error, having
// deleted what it could until then. c must be a single server's client: on
// a Cluster, SCAN walks one master only.
func Delete(ctx context.Context, c *redis.Client, pattern string) error {
	const batch = 1000
	iter := c.Scan(ctx, 0, pattern, batch).Iterator()
	keys := make([]string, 0, batch)
	unlink := func() error {
		if len(keys) == 0 {
			return nil
		}
		err := c.Unlink(ctx, keys...).Err()
		keys = keys[:0]
		return err
	}
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == batch {
			if err := unlink(); err != nil {
				return fmt.Errorf("rediskeys: delete %s: %w", pattern, err)
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("rediskeys: scan %s: %w", pattern, err)
	}
	if err := unlink(); err != nil {
		return fmt.Errorf("rediskeys: delete %s: %w", pattern, err)
	}
	return nil
}
