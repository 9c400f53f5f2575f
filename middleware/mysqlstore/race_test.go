package mysqlstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
)

// DeleteIf waits for an open in-transaction completion and decides on
// how it ended (sqlstoretest).
func TestDeleteIfWaitsForAnOpenCompletion(t *testing.T) {
	t.Parallel()
	sqlstoretest.DeleteIfWaitsForAnOpenCompletion(t, sqlTable(t))
}

// A purge waits for no open completion, and no claim queues behind it
// (sqlstoretest): a plain DELETE … LIMIT waited for the completion's row
// and held the expired rows and the gaps it had locked.
func TestPurgeBesideAnOpenCompletion(t *testing.T) {
	t.Parallel()
	sqlstoretest.PurgeBesideAnOpenCompletion(t, sqlTable(t))
}

// A reserved word, qualified by a database, is a table on the server for
// every statement (sqlstoretest.EveryStatement).
func TestReservedWordTableOnTheServer(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	ctx := context.Background()
	database := uniqueName("mysqlstore_db_")
	_, err := db.ExecContext(ctx, "CREATE DATABASE "+quoted(database))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP DATABASE "+quoted(database)) })
	for _, table := range []string{database + ".order", database + ".select", database + ".key"} {
		t.Run(table, func(t *testing.T) {
			s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			require.NoError(t, s.Migrate(ctx))
			sqlstoretest.EveryStatement(t, caseTable(db, s, table))
		})
	}
}
