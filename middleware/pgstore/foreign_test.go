package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// unwrapping wraps a store, as a user's timing wrapper would, and says so.
type unwrapping struct{ idempotency.Store }

func (u unwrapping) Unwrap() idempotency.Store { return u.Store }

// TestCompleteInTxForeignRun: a run claimed in Redis, completed in
// PostgreSQL, gets ErrForeignRun (not ErrLeaseLost, which the fence would
// answer on every attempt), and the effect rolls back. A run claimed
// through a wrapper of a pgstore.Store completes.
func TestCompleteInTxForeignRun(t *testing.T) {
	pool := testPool(t)
	pg, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	redis, err := redisstore.New(testserver.RedisClient(t))
	require.NoError(t, err)
	key := uniqueName("pgstore-foreign-")
	t.Cleanup(func() { _ = redis.Delete(context.Background(), key) })

	work := func(ctx context.Context) ([]byte, error) {
		return []byte("done"), pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{effects}.Sanitize()+" (key) VALUES ($1)", key); err != nil {
				return err
			}
			return pg.CompleteValueInTx(ctx, tx, []byte("done"))
		})
	}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: redis})
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, work)
	require.ErrorIs(t, err, pgstore.ErrForeignRun)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Contains(t, err.Error(), "*redisstore.Store", "the error names the run's store")
	assert.Contains(t, err.Error(), "claimed in another store")
	assert.Equal(t, 0, effectsOf(t, pool, effects, key), "the effect rolled back")

	wrapped, err := idempotency.NewOnce(idempotency.OnceConfig{Store: unwrapping{pg}})
	require.NoError(t, err)
	res, err := wrapped.Do(context.Background(), key, work)
	require.NoError(t, err)
	assert.Equal(t, []byte("done"), res.Value)
	assert.Equal(t, 1, effectsOf(t, pool, effects, key))
}

// TestCompleteInTxOtherTable: a run claimed by a pgstore.Store on one table
// and completed by one on another table is foreign too: its key has no
// record there, so it gets ErrForeignRun, not a lost lease on every
// redelivery, and the effect rolls back.
func TestCompleteInTxOtherTable(t *testing.T) {
	pool := testPool(t)
	claimedIn, _ := newTable(t, pool)
	other, _ := newTable(t, pool)
	effects := effectsTable(t, pool)
	key := uniqueName("pgstore-othertable-")

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: claimedIn})
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
		return nil, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(effects)+" (key) VALUES ($1)", key); err != nil {
				return err
			}
			return other.CompleteValueInTx(ctx, tx, []byte("done"))
		})
	})
	require.ErrorIs(t, err, pgstore.ErrForeignRun)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Equal(t, 0, effectsOf(t, pool, effects, key), "the effect rolled back")
}

// TestCompleteInTxOtherPool: the handler's transaction may come from a
// pool of its own on the same server and database: CompleteInTx commits
// COMPLETED in it with the effect, and a duplicate replays without running
// the work again.
func TestCompleteInTxOtherPool(t *testing.T) {
	storePool, appPool := testPool(t), testPool(t)
	require.NotSame(t, storePool, appPool)
	store, _ := newTable(t, storePool)
	effects := effectsTable(t, appPool)
	key := uniqueName("pgstore-otherpool-")

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	runs := 0
	work := func(ctx context.Context) ([]byte, error) {
		runs++
		return []byte("done"), pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(effects)+" (key) VALUES ($1)", key); err != nil {
				return err
			}
			return store.CompleteValueInTx(ctx, tx, []byte("done"))
		})
	}
	for range 2 {
		res, err := once.Do(context.Background(), key, work)
		require.NoError(t, err)
		assert.Equal(t, []byte("done"), res.Value)
	}
	assert.Equal(t, 1, runs, "the second call is a duplicate")
	assert.Equal(t, 1, effectsOf(t, appPool, effects, key))
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)
}

// TestCompleteInTxOtherDatabase: a transaction on another database of the
// server, which has a table of the store's name of its own (two services'
// DefaultTable), does not reach the store's table. It gets an error that
// says so, not a lost lease on every redelivery, and the effect rolls back.
func TestCompleteInTxOtherDatabase(t *testing.T) {
	pool := testPool(t)
	store, table := newTable(t, pool)
	other := uniqueName("pgstore_otherdb_")
	_, err := pool.Exec(context.Background(), "CREATE DATABASE "+quoted(other))
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL())
	require.NoError(t, err)
	cfg.ConnConfig.Database = other
	appPool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		appPool.Close()
		_, _ = pool.Exec(context.Background(), "DROP DATABASE "+quoted(other)+" WITH (FORCE)")
	})
	lookalike, err := pgstore.New(appPool, pgstore.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, lookalike.Migrate(context.Background()))
	effects := effectsTable(t, appPool)
	key := uniqueName("pgstore-otherdb-")

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
		return nil, pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+quoted(effects)+" (key) VALUES ($1)", key); err != nil {
				return err
			}
			return store.CompleteValueInTx(ctx, tx, []byte("done"))
		})
	})
	require.Error(t, err)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Contains(t, err.Error(), "does not reach the store's table")
	assert.Contains(t, err.Error(), other)
	assert.Equal(t, 0, effectsOf(t, appPool, effects, key), "the effect rolled back")
}
