package e2e

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// stores is where the consumers keep their idempotency records: the
// shared Redis, or on a pg- or mysql- column a table of the scenario's own
// on the shared PostgreSQL or MySQL.
type stores struct {
	storeURL string // the shared Redis the store lives in
	// newStore builds the store of one consumer; by default a redisstore
	// with its own client of the shared Redis, on a pg- or mysql- column
	// the scenario's pgStore or myStore.
	newStore func() idempotency.Store
	// On a pg- column: the pool of the shared PostgreSQL and the store on a
	// table of the scenario's own. Nil otherwise.
	pgPool  *pgxpool.Pool
	pgStore *pgstore.Store
	// On a mysql- column: the shared MySQL and the store on a table of the
	// scenario's own. Nil otherwise.
	myDB    *sql.DB
	myStore *mysqlstore.Store
	// sqlTable is the store's table on a pg- or mysql- column, and tables
	// every table to drop at the end.
	sqlTable string
	tables   []string
}

// openStores sets the consumers' store up: a redisstore on the shared
// Redis, or on a pg- or mysql- column a pgstore or mysqlstore on a new
// table.
func (e *env) openStores() {
	e.storeURL = testserver.RedisAddr(e.t)
	e.newStore = func() idempotency.Store {
		return e.redisStore(&redis.Options{ContextTimeoutEnabled: true, Addr: e.storeURL})
	}
	if !e.b.sqlStore() {
		return
	}
	e.sqlTable = testserver.UniqueName("e2e_idem_")
	e.tables = append(e.tables, e.sqlTable)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s interface {
		idempotency.Store
		Migrate(context.Context) error
	}
	if e.b.pg {
		e.pgPool = testserver.PostgresPool(e.t)
		ps, err := pgstore.New(e.pgPool, pgstore.Config{Table: e.sqlTable})
		require.NoError(e.t, err)
		e.pgStore, s = ps, ps
	} else {
		e.myDB = testserver.MySQLDB(e.t)
		ms, err := mysqlstore.New(e.myDB, mysqlstore.Config{Table: e.sqlTable})
		require.NoError(e.t, err)
		e.t.Cleanup(func() { _ = ms.Close() })
		e.myStore, s = ms, ms
	}
	require.NoError(e.t, s.Migrate(ctx))
	// One store for every consumer: it holds no state but the pool.
	e.newStore = func() idempotency.Store { return s }
}

// redisStore is a redisstore on a client of its own, closed at the end.
func (e *env) redisStore(opts *redis.Options) idempotency.Store {
	c := redis.NewClient(opts)
	e.t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	require.NoError(e.t, err)
	return s
}

// createTable creates a table of the scenario's own in the column's
// database, with columns in PostgreSQL's or MySQL's syntax, dropped at the
// end.
func (e *env) createTable(prefix, pgColumns, mysqlColumns string) string {
	table := testserver.UniqueName(prefix)
	e.tables = append(e.tables, table)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if e.b.pg {
		_, err = e.pgPool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" ("+pgColumns+")")
	} else {
		_, err = e.myDB.ExecContext(ctx, "CREATE TABLE `"+table+"` ("+mysqlColumns+") ENGINE=InnoDB")
	}
	require.NoError(e.t, err)
	return table
}

// deleteStoreState deletes the scenario's store keys from the shared Redis
// and drops its tables.
func (e *env) deleteStoreState() {
	store := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: e.storeURL})
	defer store.Close()
	e.deleteKeys(store, e.prefix+":*")
	for _, table := range e.tables {
		var err error
		if e.b.pg {
			_, err = e.pgPool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
		} else {
			_, err = e.myDB.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
		}
		if err != nil {
			e.t.Errorf("drop table %s: %v", table, err)
		}
	}
}

// sqlTableOf is the store's table when on is set (the column's database is
// the one asked about), else "".
func (e *env) sqlTableOf(on bool) string {
	if on {
		return e.sqlTable
	}
	return ""
}
