package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
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
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: redis}, nil)
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, work)
	require.ErrorIs(t, err, pgstore.ErrForeignRun)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Contains(t, err.Error(), "*redisstore.Store", "the error names the run's store")
	assert.Contains(t, err.Error(), "claimed in another store")
	assert.Equal(t, 0, effectsOf(t, pool, effects, key), "the effect rolled back")

	wrapped, err := idempotency.NewOnce(idempotency.OnceConfig{Store: unwrapping{pg}}, nil)
	require.NoError(t, err)
	res, err := wrapped.Do(context.Background(), key, work)
	require.NoError(t, err)
	assert.Equal(t, []byte("done"), res.Value)
	assert.Equal(t, 1, effectsOf(t, pool, effects, key))
}
