package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/internal/killtest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// killChild consumes the topic under the idempotency middleware on the store
// named by c.Kind, making one row in the effects table per run of the
// handler, until it is killed. With pgstore the row and COMPLETED commit in
// one transaction; with redisstore the row commits on its own and the
// middleware writes COMPLETED to Redis after the handler returned, as it does
// for any effect outside the store.
func killChild(c *killtest.Consumer) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testserver.PostgresURL())
	if err != nil {
		return c.Exit(err)
	}
	defer pool.Close()
	insert := "INSERT INTO " + quoted(c.Effects) + " (key) VALUES ($1)"

	switch c.Kind {
	case "pgstore":
		pg, err := pgstore.New(pool, pgstore.Config{Table: c.Table})
		if err != nil {
			return c.Exit(err)
		}
		return c.Exit(c.Consume(pg, func(ctx context.Context, key string) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insert, key); err != nil {
					return err
				}
				c.Say(killtest.PhaseEffect, key)
				// Half of the window before the completion, half after it,
				// while the completion holds the key's row locked.
				time.Sleep(killtest.Window / 2)
				if err := pg.CompleteInTx(ctx, tx); err != nil {
					return err
				}
				time.Sleep(killtest.Window / 2)
				return nil
			})
		}))
	case "redisstore":
		rs, err := redisstore.New(redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: c.Redis}), nil)
		if err != nil {
			return c.Exit(err)
		}
		return c.Exit(c.Consume(rs, func(ctx context.Context, key string) error {
			if _, err := pool.Exec(ctx, insert, key); err != nil { // commits on its own
				return err
			}
			c.Say(killtest.PhaseEffect, key)
			time.Sleep(killtest.Window)
			return nil // the middleware writes COMPLETED next
		}))
	default:
		return c.Exit(fmt.Errorf("unknown store %q", c.Kind))
	}
}

// killSetup is a run of kind ("pgstore" or "redisstore") on a fresh
// effects table and, for pgstore, a fresh store table.
func killSetup(t *testing.T, kind string, pool *pgxpool.Pool, rc *redis.Client, keys []string) killtest.Setup {
	t.Helper()
	s := killtest.Setup{Kind: kind, Effects: effectsTable(t, pool), Redis: rc, Keys: keys}
	s.CountEffects = func(ctx context.Context) (map[string]int, error) {
		rows, err := pool.Query(ctx, "SELECT key, count(*) FROM "+quoted(s.Effects)+" GROUP BY key")
		if err != nil {
			return nil, err
		}
		perKey := map[string]int{}
		var (
			key string
			n   int
		)
		_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
			perKey[key] = n
			return nil
		})
		return perKey, err
	}
	switch kind {
	case "pgstore":
		s.Store, s.Table = newTable(t, pool)
	case "redisstore":
		store, err := redisstore.New(rc, nil)
		require.NoError(t, err)
		s.Store = store
	}
	return s
}

// A consumer process is SIGKILLed 30 times, in the three windows of a
// message's handling, and restarted each time; the same schedule runs with
// pgstore, whose handler commits its effect and COMPLETED in one
// transaction, and with redisstore, whose effect commits on its own before
// the middleware writes COMPLETED. pgstore must leave exactly one effect per
// key; redisstore loses no key but may double those killed between the
// effect and the completion, which the test reports.
func TestKillConsumerProcess(t *testing.T) {
	pool := testPool(t)
	rc := testserver.RedisClient(t)
	keys, schedule := killtest.Keys(60), killtest.Schedule(10)

	t.Run("pgstore", func(t *testing.T) {
		k := killtest.New(t, killSetup(t, "pgstore", pool, rc, keys))
		c := k.Kill(schedule)
		t.Log(k.Report(c))
		k.AssertExactlyOnce(c)
	})
	t.Run("redisstore", func(t *testing.T) {
		k := killtest.New(t, killSetup(t, "redisstore", pool, rc, keys))
		c := k.Kill(schedule)
		t.Log(k.Report(c))
		k.AssertNoneLost(c)
	})
}
