package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// testPool is the shared PostgreSQL server's pool (testserver.PostgresPool).
func testPool(t testing.TB) *pgxpool.Pool { return testserver.PostgresPool(t) }

// uniqueName returns prefix plus a random suffix: every test run has tables
// of its own on the shared server.
func uniqueName(prefix string) string { return testserver.UniqueName(prefix) }

// newTable returns a store on a new table, created with Migrate and dropped
// when the test ends, and the table's name.
func newTable(t testing.TB, pool *pgxpool.Pool) (*pgstore.Store, string) {
	t.Helper()
	table := uniqueName("pgstore_test_")
	s, err := pgstore.New(pool, pgstore.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, pool, table) })
	require.NoError(t, s.Migrate(context.Background()))
	return s, table
}

func dropTable(t testing.TB, pool *pgxpool.Pool, table string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	if err != nil {
		t.Errorf("drop table %s: %v", table, err)
	}
}

// quoted returns table, optionally qualified by a schema, as an SQL
// identifier.
func quoted(table string) string { return pgx.Identifier(strings.Split(table, ".")).Sanitize() }
