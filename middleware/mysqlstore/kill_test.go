package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/internal/killtest"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// killChild consumes the topic under the idempotency middleware on
// mysqlstore, making one row in the effects table per run of the handler,
// until it is killed. The row and COMPLETED commit in one READ COMMITTED
// transaction.
func killChild(c *killtest.Consumer) int {
	if c.Kind != "mysqlstore" {
		return c.Exit(fmt.Errorf("unknown store %q", c.Kind))
	}
	db, err := sql.Open("mysql", testserver.MySQLDSN())
	if err != nil {
		return c.Exit(err)
	}
	defer db.Close()
	insert := "INSERT INTO " + quoted(c.Effects) + " (k) VALUES (?)"

	store, err := mysqlstore.New(db, mysqlstore.Config{Table: c.Table})
	if err != nil {
		return c.Exit(err)
	}
	return c.Exit(c.Consume(store, func(ctx context.Context, key string) error {
		return inTx(ctx, db, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, insert, key); err != nil {
				return err
			}
			c.Say(killtest.PhaseEffect, key)
			// Half of the window before the completion, half after it,
			// while the completion holds the key's row locked.
			time.Sleep(killtest.Window / 2)
			if err := store.CompleteInTx(ctx, tx); err != nil {
				return err
			}
			time.Sleep(killtest.Window / 2)
			return nil
		})
	}))
}

// countEffects returns the rows of the effects table by key.
func countEffects(ctx context.Context, db *sql.DB, table string) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, "SELECT k, count(*) FROM "+quoted(table)+" GROUP BY k")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	perKey := map[string]int{}
	for rows.Next() {
		var (
			key string
			n   int
		)
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		perKey[key] = n
	}
	return perKey, rows.Err()
}

// A consumer process is SIGKILLed 30 times, in the three windows of a
// message's handling, and restarted each time, as pgstore's kill test does
// (whose redisstore run is the contrast: an effect outside the store's
// transaction doubles when killed between the effect and the completion).
// mysqlstore's handler commits its effect and COMPLETED in one transaction,
// so it must leave exactly one effect per key.
func TestKillConsumerProcess(t *testing.T) {
	db := testDB(t)
	s := killtest.Setup{
		Kind: "mysqlstore", Effects: effectsTable(t, db),
		Redis: testserver.RedisClient(t), Keys: killtest.Keys(60),
	}
	s.Store, s.Table = newTable(t, db)
	s.CountEffects = func(ctx context.Context) (map[string]int, error) { return countEffects(ctx, db, s.Effects) }

	k := killtest.New(t, s)
	c := k.Kill(killtest.Schedule(10))
	t.Log(k.Report(c))
	k.AssertExactlyOnce(c)
}
