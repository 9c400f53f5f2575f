package pgstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// DeleteIf waits for an open in-transaction completion and decides on
// how it ended (sqlstoretest).
func TestDeleteIfWaitsForAnOpenCompletion(t *testing.T) {
	t.Parallel()
	sqlstoretest.DeleteIfWaitsForAnOpenCompletion(t, sqlTable(t))
}

// A purge waits for no open completion, and no claim queues behind it
// (sqlstoretest).
func TestPurgeBesideAnOpenCompletion(t *testing.T) {
	t.Parallel()
	sqlstoretest.PurgeBesideAnOpenCompletion(t, sqlTable(t))
}

// A reserved word, qualified by a schema, is a table on the server for
// every statement (sqlstoretest.EveryStatement).
func TestReservedWordTableOnTheServer(t *testing.T) {
	t.Parallel()
	pool := testPool(t)
	ctx := context.Background()
	schema := uniqueName("pgstore_schema_")
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+quoted(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+quoted(schema)+" CASCADE") })
	for _, table := range []string{schema + ".order", schema + ".select", schema + ".user"} {
		t.Run(table, func(t *testing.T) {
			s, err := pgstore.New(pool, pgstore.Config{Table: table})
			require.NoError(t, err)
			require.NoError(t, s.Migrate(ctx))
			sqlstoretest.EveryStatement(t, tableOf(pool, s, table))
		})
	}
}
