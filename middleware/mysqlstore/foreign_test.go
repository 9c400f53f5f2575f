package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

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

// TestCompleteInTxOtherTable: a run claimed by a mysqlstore.Store on one
// table and completed by one on another table is foreign too: its key has
// no record there, so it gets ErrForeignRun, not a lost lease on every
// redelivery, and the effect rolls back.
func TestCompleteInTxOtherTable(t *testing.T) {
	db := testDB(t)
	claimedIn, _ := newTable(t, db)
	other, _ := newTable(t, db)
	effects := effectsTable(t, db)
	key := uniqueName("mysqlstore-othertable-")

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: claimedIn}, nil)
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
		return nil, inTx(ctx, db, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES (?)", key); err != nil {
				return err
			}
			return other.CompleteValueInTx(ctx, tx, []byte("done"))
		})
	})
	require.ErrorIs(t, err, mysqlstore.ErrForeignRun)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Equal(t, 0, effectsOf(t, db, effects, key), "the effect rolled back")
}

// TestCompleteInTxOtherPool: the handler's transaction may come from a
// *sql.DB of its own (a second pool on the same server and database):
// CompleteInTx commits COMPLETED in it with the effect, and a duplicate
// replays without running the work again.
func TestCompleteInTxOtherPool(t *testing.T) {
	storeDB, appDB := testDB(t), testDB(t)
	require.NotSame(t, storeDB, appDB)
	store, _ := newTable(t, storeDB)
	effects := effectsTable(t, appDB)
	key := uniqueName("mysqlstore-otherpool-")

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store}, nil)
	require.NoError(t, err)
	runs := 0
	work := func(ctx context.Context) ([]byte, error) {
		runs++
		return []byte("done"), inTx(ctx, appDB, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES (?)", key); err != nil {
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
	assert.Equal(t, 1, effectsOf(t, appDB, effects, key))
	rec, err := store.Get(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateCompleted, rec.State)

	// A refused fence reads the row in the same transaction, on that pool too.
	err = inTx(context.Background(), appDB, func(tx *sql.Tx) error {
		return store.CompleteTx(context.Background(), tx, key, "not-the-owner", nil, time.Hour)
	})
	require.ErrorIs(t, err, idempotency.ErrLeaseLost)

	// A transaction that has ended is refused as such, whichever pool.
	for _, db := range []*sql.DB{storeDB, appDB} {
		tx, err := db.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback())
		err = store.CompleteTx(context.Background(), tx, key, "not-the-owner", nil, time.Hour)
		require.ErrorIs(t, err, sql.ErrTxDone)
	}
}
