package mysqlstore_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// testDB is the shared MySQL or MariaDB server (testserver.MySQLDB).
func testDB(t testing.TB) *sql.DB { return testserver.MySQLDB(t) }

// uniqueName returns prefix plus a random suffix: every test run has tables
// of its own on the shared server.
func uniqueName(prefix string) string { return testserver.UniqueName(prefix) }

// newTable returns a store on a new table, created with Migrate and dropped
// when the test ends, and the table's name.
func newTable(t testing.TB, db *sql.DB) (*mysqlstore.Store, string) {
	t.Helper()
	table := uniqueName("mysqlstore_test_")
	s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		dropTable(t, db, table)
	})
	require.NoError(t, s.Migrate(context.Background()))
	return s, table
}

func dropTable(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+quoted(table)); err != nil {
		t.Errorf("drop table %s: %v", table, err)
	}
}

// quoted returns table, optionally qualified by a database, as an SQL
// identifier (tests' names need no escaping).
func quoted(table string) string { return "`" + strings.ReplaceAll(table, ".", "`.`") + "`" }

// tableOf returns the table of a store made by newTable.
func tableOf(t testing.TB, s *mysqlstore.Store) string {
	t.Helper()
	return mysqlstore.TableOf(s)
}
