package mysqlstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
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
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: redis})
	require.NoError(t, err)
	_, err = once.Do(context.Background(), key, work)
	require.ErrorIs(t, err, mysqlstore.ErrForeignRun)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Contains(t, err.Error(), "*redisstore.Store", "the error names the run's store")
	assert.Contains(t, err.Error(), "claimed in another store")
	assert.Equal(t, 0, effectsOf(t, db, effects, key), "the effect rolled back")

	wrapped, err := idempotency.NewOnce(idempotency.OnceConfig{Store: unwrapping{my}})
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

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: claimedIn})
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

	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
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

// TestCompleteInTxOtherDatabase: a transaction on another database of the
// same server does not reach the store's unqualified table. It gets an
// error that says so, whether that database has no such table (not "create
// it with Migrate", which the store's database did) or a table of the same
// name of its own (not a lost lease, on every redelivery), and the effect
// rolls back. A table qualified with the store's database is reached.
func TestCompleteInTxOtherDatabase(t *testing.T) {
	storeDB := testDB(t)
	store, table := newTable(t, storeDB)
	other := uniqueName("mysqlstore_otherdb_")
	_, err := storeDB.ExecContext(context.Background(), "CREATE DATABASE "+quoted(other))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = storeDB.ExecContext(context.Background(), "DROP DATABASE "+quoted(other)) })
	appDB := dbOn(t, other)
	effects := effectsTable(t, appDB)
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	complete := func(s *mysqlstore.Store) error {
		key := uniqueName("mysqlstore-otherdb-")
		_, err := once.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
			return nil, inTx(ctx, appDB, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+quoted(effects)+" (k) VALUES (?)", key); err != nil {
					return err
				}
				return s.CompleteValueInTx(ctx, tx, []byte("done"))
			})
		})
		want := 1
		if err != nil {
			want = 0 // rolled back
		}
		assert.Equal(t, want, effectsOf(t, appDB, effects, key))
		return err
	}

	err = complete(store)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not on the store's database", "no such table")
	assert.Contains(t, err.Error(), other)

	lookalike, err := mysqlstore.New(appDB, mysqlstore.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, lookalike.Migrate(context.Background()))
	err = complete(store)
	require.Error(t, err)
	assert.NotErrorIs(t, err, idempotency.ErrLeaseLost, "a table of the same name")
	assert.Contains(t, err.Error(), "not on the store's database")

	var storeDatabase string
	require.NoError(t, storeDB.QueryRowContext(context.Background(), "SELECT DATABASE()").Scan(&storeDatabase))
	qualified, err := mysqlstore.New(storeDB, mysqlstore.Config{Table: storeDatabase + "." + table})
	require.NoError(t, err)
	once, err = idempotency.NewOnce(idempotency.OnceConfig{Store: qualified})
	require.NoError(t, err)
	require.NoError(t, complete(qualified), "a qualified table is reached from any database")
}

// dbOn returns a *sql.DB on the test server whose connections use database
// name.
func dbOn(t *testing.T, name string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testserver.MySQLDSN())
	require.NoError(t, err)
	cfg.DBName = name
	connector, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
