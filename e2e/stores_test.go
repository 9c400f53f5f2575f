package e2e

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// stores is where the consumers keep their idempotency records: the
// shared Redis, or on a pg- column a table of the scenario's own on the
// shared PostgreSQL.
type stores struct {
	storeURL string // the shared Redis the store lives in
	// newStore builds the store of one consumer; by default a redisstore
	// with its own client of the shared Redis, on a pg- column the
	// scenario's pgStore.
	newStore func() idempotency.Store
	// On a pg- column: the pool of the shared PostgreSQL, the store on a
	// table of the scenario's own (pgTable), and the tables to drop at the
	// end. Nil and empty otherwise.
	pgPool   *pgxpool.Pool
	pgStore  *pgstore.Store
	pgTable  string
	pgTables []string
}

// openStores sets the consumers' store up: a redisstore on the shared
// Redis, or on a pg- column a pgstore on a new table.
func (e *env) openStores() {
	e.storeURL = testserver.RedisAddr(e.t)
	e.newStore = func() idempotency.Store {
		return e.redisStore(&redis.Options{ContextTimeoutEnabled: true, Addr: e.storeURL})
	}
	if !e.b.pg {
		return
	}
	e.pgPool = testserver.PostgresPool(e.t)
	e.pgTable = testserver.UniqueName("e2e_idem_")
	e.pgTables = append(e.pgTables, e.pgTable)
	s, err := pgstore.New(e.pgPool, pgstore.Config{Table: e.pgTable})
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(e.t, s.Migrate(ctx))
	e.pgStore = s
	// One store for every consumer: it holds no state but the pool.
	e.newStore = func() idempotency.Store { return s }
}

// redisStore is a redisstore on a client of its own, closed at the end.
func (e *env) redisStore(opts *redis.Options) idempotency.Store {
	c := redis.NewClient(opts)
	e.t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c)
	require.NoError(e.t, err)
	return s
}

// createTable creates a table of the scenario's own, dropped at the end.
func (e *env) createTable(prefix, columns string) string {
	table := testserver.UniqueName(prefix)
	e.pgTables = append(e.pgTables, table)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.pgPool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" ("+columns+")")
	require.NoError(e.t, err)
	return table
}

// deleteStoreState deletes the scenario's store keys from the shared Redis
// and drops its tables.
func (e *env) deleteStoreState() {
	store := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: e.storeURL})
	defer store.Close()
	e.deleteKeys(store, e.prefix+":*")
	for _, table := range e.pgTables {
		if _, err := e.pgPool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
			e.t.Errorf("drop table %s: %v", table, err)
		}
	}
}
