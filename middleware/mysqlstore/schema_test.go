package mysqlstore_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// offlineDB is a *sql.DB that never connects (nothing listens on port 1):
// New does not contact the server, so its checks run without one.
func offlineDB(t *testing.T) *sql.DB {
	db, err := sql.Open("mysql", "nobody@tcp(127.0.0.1:1)/none")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestNewRejectsANilDB(t *testing.T) {
	s, err := mysqlstore.New(nil, mysqlstore.Config{})
	assert.ErrorIs(t, err, mysqlstore.ErrNilDB)
	assert.Nil(t, s)
}

func TestTableNames(t *testing.T) {
	db := offlineDB(t)
	long := strings.Repeat("t", 51) // 51 + len("_record_valid") = 64
	for _, tc := range []struct {
		table              string
		ok                 bool
		quoted, constraint string
	}{
		{"", true, "`idempotency_keys`", "`idempotency_keys_record_valid`"},
		{"idempotency_keys", true, "`idempotency_keys`", "`idempotency_keys_record_valid`"},
		{"app.keys", true, "`app`.`keys`", "`keys_record_valid`"},
		{"_k1", true, "`_k1`", "`_k1_record_valid`"},
		{"order", true, "`order`", "`order_record_valid`"}, // a reserved word: quoted
		{long, true, "`" + long + "`", "`" + long + "_record_valid`"},
		{strings.Repeat("s", 64) + ".keys", true, "`" + strings.Repeat("s", 64) + "`.`keys`", "`keys_record_valid`"},
		{long + "t", false, "", ""},                        // the constraint's name would not fit
		{strings.Repeat("s", 65) + ".keys", false, "", ""}, // the database name does not fit
		{"Keys", false, "", ""},                            // case depends on lower_case_table_names: refused
		{"1keys", false, "", ""},
		{"a.b.c", false, "", ""},
		{".keys", false, "", ""},
		{"app.", false, "", ""},
		{"my-keys", false, "", ""},
		{"my keys", false, "", ""},
		{"k`; DROP TABLE x; --", false, "", ""},
		{"kéys", false, "", ""},
	} {
		s, err := mysqlstore.New(db, mysqlstore.Config{Table: tc.table})
		ddl, serr := mysqlstore.Schema(mysqlstore.Config{Table: tc.table})
		if !tc.ok {
			assert.ErrorIs(t, err, mysqlstore.ErrInvalidTable, "New %q", tc.table)
			assert.ErrorIs(t, serr, mysqlstore.ErrInvalidTable, "Schema %q", tc.table)
			assert.Nil(t, s)
			continue
		}
		require.NoError(t, err, tc.table)
		require.NoError(t, serr, tc.table)
		assert.Equal(t, ddl, s.Schema(), "Schema(cfg) and Store.Schema agree")
		assert.Contains(t, ddl, "CREATE TABLE IF NOT EXISTS "+tc.quoted+" (", tc.table)
		assert.Contains(t, ddl, "CONSTRAINT "+tc.constraint+" CHECK", tc.table)
		assert.Contains(t, ddl, "KEY expires_at (expires_at)", tc.table)
	}
}

// Tokens and fingerprints longer than their columns are refused before they
// reach a server that might cut them (outside strict SQL mode).
func TestLongTokenAndFingerprint(t *testing.T) {
	s, err := mysqlstore.New(offlineDB(t), mysqlstore.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = s.Claim(ctx, "k", idempotency.ClaimRequest{Token: strings.Repeat("t", 256), Lease: time.Minute, TTL: time.Minute})
	assert.ErrorIs(t, err, mysqlstore.ErrTooLong)
	_, err = s.Claim(ctx, "k", idempotency.ClaimRequest{Token: "t", Lease: time.Minute, TTL: time.Minute, Fingerprint: make([]byte, 65536)})
	assert.ErrorIs(t, err, mysqlstore.ErrTooLong)
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	table := uniqueName("mysqlstore_test_")
	t.Cleanup(func() { dropTable(t, db, table) })
	s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
	require.NoError(t, err)

	// Processes starting together all migrate: none may fail.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = s.Migrate(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "concurrent Migrate %d", i)
	}

	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
	res, err := s.Claim(ctx, "k", req)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, s.Migrate(ctx), "Migrate again")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, req.Token, rec.Token, "Migrate leaves an existing table and its rows alone")

	var index, constraint string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT column_name FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND table_name = ? AND index_name = 'expires_at'`, table).Scan(&index))
	assert.Equal(t, "expires_at", index)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT constraint_name FROM information_schema.table_constraints
		WHERE table_schema = DATABASE() AND table_name = ? AND constraint_type = 'CHECK'`, table).Scan(&constraint))
	assert.Equal(t, table+"_record_valid", constraint)
}

func TestNewCreatesNothing(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	table := uniqueName("mysqlstore_test_")
	s, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
	require.NoError(t, err)
	_, err = s.Claim(ctx, "k", idempotency.ClaimRequest{Token: "t", Lease: time.Minute, TTL: time.Minute})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Migrate", "the error says how to create the table")
	assert.Equal(t, uint16(1146), mysqlErrno(err))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name = ?`, table).Scan(&n))
	assert.Zero(t, n, "the store runs no DDL by itself")
}

func TestDatabaseQualifiedTable(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	schema := uniqueName("mysqlstore_test_db_")
	_, err := db.ExecContext(ctx, "CREATE DATABASE "+quoted(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP DATABASE "+quoted(schema)) })
	s, err := mysqlstore.New(db, mysqlstore.Config{Table: schema + ".keys"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.Migrate(ctx))

	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
	res, err := s.Claim(ctx, "k", req)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, s.Complete(ctx, "k", req.Token, []byte("done"), time.Minute))
	var result []byte
	require.NoError(t, db.QueryRowContext(ctx, "SELECT result FROM "+quoted(schema)+".`keys` WHERE `key` = 'k'").Scan(&result))
	assert.Equal(t, []byte("done"), result, "the record lives in the database's table")
}

// The table's CHECK constraint refuses every row the corrupt-record case
// writes, so a store on a table made by Migrate meets them only when
// something went around it.
func TestConstraintRefusesForeignRows(t *testing.T) {
	db := testDB(t)
	_, table := newTable(t, db)
	for _, kind := range storetest.Foreigns {
		err := putForeign(db, table, "foreign:"+kind, kind)
		assert.Contains(t, []uint16{3819, 4025}, mysqlErrno(err), "%v: a CHECK violation: %v", kind, err)
	}
}

// A lease shorter than the time between the claim's write and its read
// (here 1 µs) lapses before the read: the claim still acquired, and says
// so, once, with one attempt; it does not write again and count more.
func TestClaimWhoseLeaseLapsedBeforeItsRead(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, _ := newTable(t, db)
	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Microsecond, TTL: time.Minute}
	res, err := s.Claim(ctx, "k", req)
	require.NoError(t, err)
	assert.True(t, res.Acquired, "the claim wrote its token")
	assert.Equal(t, idempotency.StateInProgress, res.Record.State)
	assert.Equal(t, req.Token, res.Record.Token)
	assert.Equal(t, 1, res.Record.Attempts, "one claim, one attempt")
	assert.ErrorIs(t, s.Renew(ctx, "k", req.Token, time.Minute), idempotency.ErrLeaseLost, "the lapsed lease is nobody's")
	rec, err := s.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idempotency.StateFailed, rec.State)
	assert.Equal(t, 1, rec.Attempts)
}
