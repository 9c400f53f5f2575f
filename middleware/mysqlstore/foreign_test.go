package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// unwrapping wraps a store, as a user's timing wrapper would, and says so.
type unwrapping struct{ idempotency.Store }

func (u unwrapping) Unwrap() idempotency.Store { return u.Store }

// TestCompleteInTxForeignRun: a run claimed in Redis, completed in MySQL,
// gets ErrForeignRun (not ErrLeaseLost, which the fence would answer on
// every attempt), and the effect rolls back. A run claimed through a
// wrapper of a mysqlstore.Store completes.
func TestCompleteInTxForeignRun(t *testing.T) {
	db := testDB(t)
	my, _ := newTable(t, db)
	effects := effectsTable(t, db)
	redis, err := redisstore.New(testserver.RedisClient(t))
	require.NoError(t, err)
	key := uniqueName("mysqlstore-foreign-")
	t.Cleanup(func() { _ = redis.Delete(context.Background(), key) })

	work := func(ctx context.Context) ([]byte, error) {
		return []byte("done"), inTx(ctx, db, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES (?)", key); err != nil {
				return err
			}
			return my.CompleteValueInTx(ctx, tx, []byte("done"))
		})
	}
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: redis}, nil)
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, work)
	require.ErrorIs(t, err, mysqlstore.ErrForeignRun)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Contains(t, err.Error(), "*redisstore.Store", "the error names the run's store")
	assert.Contains(t, err.Error(), "claimed in another store")
	assert.Equal(t, 0, effectsOf(t, db, effects, key), "the effect rolled back")

	wrapped, err := idempotency.NewOnce(idempotency.OnceConfig{Store: unwrapping{my}}, nil)
	require.NoError(t, err)
	res, err := wrapped.Do(context.Background(), key, work)
	require.NoError(t, err)
	assert.Equal(t, []byte("done"), res.Value)
	assert.Equal(t, 1, effectsOf(t, db, effects, key))
}
