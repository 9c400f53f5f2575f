package pgstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	table := uniqueName("pgstore_test_")
	t.Cleanup(func() { dropTable(t, pool, table) })
	s, err := pgstore.New(pool, pgstore.Config{Table: table})
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
	require.NoError(t, pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE tablename = $1 AND indexname = $2`,
		table, table+"_expires_at").Scan(&index))
	assert.Contains(t, index, "(expires_at)")
	require.NoError(t, pool.QueryRow(ctx, `SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'`,
		quoted(table)).Scan(&constraint))
	assert.Equal(t, "idempotency_record_valid", constraint)
}

func TestNewCreatesNothing(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	table := uniqueName("pgstore_test_")
	s, err := pgstore.New(pool, pgstore.Config{Table: table})
	require.NoError(t, err)
	_, err = s.Claim(ctx, "k", idempotency.ClaimRequest{Token: "t", Lease: time.Minute, TTL: time.Minute})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Migrate", "the error says how to create the table")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "42P01", pgErr.Code)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, quoted(table)).Scan(&exists))
	assert.False(t, exists, "the store runs no DDL by itself")
}

func TestSchemaQualifiedTable(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	schema := uniqueName("pgstore_test_schema_")
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+quoted(schema))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+quoted(schema)+" CASCADE") })
	s, err := pgstore.New(pool, pgstore.Config{Table: schema + ".keys"})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))

	req := idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute}
	res, err := s.Claim(ctx, "k", req)
	require.NoError(t, err)
	require.True(t, res.Acquired)
	require.NoError(t, s.Complete(ctx, "k", req.Token, []byte("done"), time.Minute))
	var result []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT result FROM `+quoted(schema)+`.keys WHERE key = 'k'`).Scan(&result))
	assert.Equal(t, []byte("done"), result, "the record lives in the schema's table")
}

// The table's CHECK constraint refuses every row the corrupt-record case
// writes, so a store on a table made by Migrate meets them only when
// something went around it.
func TestConstraintRefusesForeignRows(t *testing.T) {
	pool := testPool(t)
	_, table := newTable(t, pool)
	for _, kind := range storetest.Foreigns {
		err := putForeign(pool, table, "foreign:"+kind, kind)
		var pgErr *pgconn.PgError
		if assert.ErrorAs(t, err, &pgErr, "%v", kind) {
			assert.Equal(t, "23514", pgErr.Code, "%v: check_violation", kind)
		}
	}
}

// A corrupt row under a constraint added NOT VALID (which checks only new
// writes) cannot even be written back unchanged: the claim that keeps it
// gets the constraint's refusal, which is ErrCorruptRecord too.
func TestCorruptRowUnderNotValidConstraint(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, table := newTable(t, pool)
	_, err := pool.Exec(ctx, "ALTER TABLE "+quoted(table)+" DROP CONSTRAINT idempotency_record_valid")
	require.NoError(t, err)
	require.NoError(t, putForeign(pool, table, "k", "bad-fields"))
	_, err = pool.Exec(ctx, "ALTER TABLE "+quoted(table)+" ADD CONSTRAINT idempotency_record_valid CHECK (attempts >= 1) NOT VALID")
	require.NoError(t, err)

	res, err := s.Claim(ctx, "k", idempotency.ClaimRequest{Token: "t", Lease: time.Minute, TTL: time.Minute})
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	assert.False(t, res.Acquired)
	_, err = s.Get(ctx, "k")
	assert.ErrorIs(t, err, idempotency.ErrCorruptRecord)
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts FROM `+quoted(table)+` WHERE key = 'k'`).Scan(&attempts))
	assert.Equal(t, 0, attempts, "the row is as it was")
}

// corruptVariants are rows that violate one invariant each, and valid rows
// beside them, over the columns (state, token, attempts, result, lease_until,
// claim_ttl_us, created_at, updated_at, expires_at). Every row has token
// 'tok' where it has one, and a live lease where it has one, so that an
// owner call with 'tok' would apply if the store did not check the row.
var corruptVariants = []struct {
	name   string
	values string
	valid  bool
}{
	{"in_progress", `'in_progress', 'tok', 1, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, true},
	{"completed", `'completed', 'tok', 2, 'r', NULL, NULL, now(), now(), now() + interval '1 hour'`, true},
	{"completed-empty-result", `'completed', 'tok', 1, '', NULL, NULL, now(), now(), now() + interval '1 hour'`, true},
	{"failed", `'failed', 'tok', 1, NULL, NULL, NULL, now(), now(), now() + interval '1 hour'`, true},
	{"failed-released", `'failed', NULL, 1, NULL, NULL, NULL, now(), now(), now() + interval '1 hour'`, true},

	{"no-state", `NULL, 'tok', 1, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"unknown-state", `'IN_PROGRESS', 'tok', 1, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"no-attempts", `'in_progress', 'tok', NULL, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"zero-attempts", `'in_progress', 'tok', 0, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"negative-attempts", `'completed', 'tok', -1, 'r', NULL, NULL, now(), now(), now() + interval '1 hour'`, false},
	{"no-created", `'in_progress', 'tok', 1, NULL, now() + interval '1 hour', 1000000, NULL, now(), now() + interval '2 hours'`, false},
	{"no-updated", `'completed', 'tok', 1, 'r', NULL, NULL, now(), NULL, now() + interval '1 hour'`, false},
	{"no-expiry", `'in_progress', 'tok', 1, NULL, now() + interval '1 hour', 1000000, now(), now(), NULL`, false},
	{"in_progress-no-token", `'in_progress', NULL, 1, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"in_progress-empty-token", `'in_progress', '', 1, NULL, now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"in_progress-no-lease", `'in_progress', 'tok', 1, NULL, NULL, 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"in_progress-no-ttl", `'in_progress', 'tok', 1, NULL, now() + interval '1 hour', NULL, now(), now(), now() + interval '2 hours'`, false},
	{"in_progress-zero-ttl", `'in_progress', 'tok', 1, NULL, now() + interval '1 hour', 0, now(), now(), now() + interval '2 hours'`, false},
	{"in_progress-result", `'in_progress', 'tok', 1, 'r', now() + interval '1 hour', 1000000, now(), now(), now() + interval '2 hours'`, false},
	{"completed-no-token", `'completed', NULL, 1, 'r', NULL, NULL, now(), now(), now() + interval '1 hour'`, false},
	{"completed-empty-token", `'completed', '', 1, 'r', NULL, NULL, now(), now(), now() + interval '1 hour'`, false},
	{"completed-lease", `'completed', 'tok', 1, 'r', now() + interval '1 hour', NULL, now(), now(), now() + interval '1 hour'`, false},
	{"completed-ttl", `'completed', 'tok', 1, 'r', NULL, 1000000, now(), now(), now() + interval '1 hour'`, false},
	{"completed-no-result", `'completed', 'tok', 1, NULL, NULL, NULL, now(), now(), now() + interval '1 hour'`, false},
	{"failed-lease", `'failed', 'tok', 1, NULL, now() + interval '1 hour', NULL, now(), now(), now() + interval '1 hour'`, false},
	{"failed-ttl", `'failed', 'tok', 1, NULL, NULL, 1000000, now(), now(), now() + interval '1 hour'`, false},
	{"failed-result", `'failed', 'tok', 1, 'r', NULL, NULL, now(), now(), now() + interval '1 hour'`, false},
	{"expired-corrupt", `'in_progress', NULL, 0, NULL, NULL, NULL, now(), now(), now() - interval '1 hour'`, false},
}

// TestCorruptVariants writes each variant into a table without any
// constraint but its primary key, as a table made by someone else may be,
// and checks that the SQL condition the statements use and the Go decoding
// agree on every row, and that no method rewrites a corrupt one: Records
// yields it with its Err, and DeleteIf keeps it.
func TestCorruptVariants(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	s, table := newTable(t, pool)
	q := quoted(table)
	_, err := pool.Exec(ctx, `ALTER TABLE `+q+` DROP CONSTRAINT idempotency_record_valid,
		ALTER state DROP NOT NULL, ALTER attempts DROP NOT NULL, ALTER created_at DROP NOT NULL,
		ALTER updated_at DROP NOT NULL, ALTER expires_at DROP NOT NULL`)
	require.NoError(t, err)

	snapshot := func(key string) string {
		var text string
		require.NoError(t, pool.QueryRow(ctx, `SELECT r::text FROM `+q+` AS r WHERE key = $1`, []byte(key)).Scan(&text))
		return text
	}
	for _, v := range corruptVariants {
		key := "variant:" + v.name
		_, err := pool.Exec(ctx, `INSERT INTO `+q+` (key_hash, key, state, token, attempts, result, lease_until,
			claim_ttl_us, created_at, updated_at, expires_at) VALUES (sha256($1), $1, `+v.values+`)`, []byte(key))
		require.NoError(t, err, v.name)

		var sqlValid bool
		checkErr, scanErr := pgstore.CheckScan(pool.QueryRow(ctx,
			`SELECT `+pgstore.ValidSQL("r")+`, `+pgstore.Columns+` FROM `+q+` AS r WHERE key_hash = sha256($1)`, []byte(key)), &sqlValid)
		require.NoError(t, scanErr, v.name)
		assert.Equal(t, v.valid, sqlValid, "%s: the statements' condition", v.name)
		assert.Equal(t, v.valid, checkErr == nil, "%s: the decoding: %v", v.name, checkErr)
		if v.valid {
			continue
		}
		assert.ErrorIs(t, checkErr, idempotency.ErrCorruptRecord, v.name)

		before := snapshot(key)
		corrupt := func(op string, err error) {
			t.Helper()
			assert.ErrorIs(t, err, idempotency.ErrCorruptRecord, "%s: %s", v.name, op)
		}
		for _, tok := range []string{"tok", "other"} {
			res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: tok, Lease: time.Minute, TTL: time.Minute})
			corrupt("claim "+tok, err)
			assert.False(t, res.Acquired, v.name)
			_, err = s.Get(ctx, key)
			corrupt("get", err)
			corrupt("renew "+tok, s.Renew(ctx, key, tok, time.Minute))
			corrupt("complete "+tok, s.Complete(ctx, key, tok, []byte("x"), time.Minute))
			corrupt("fail "+tok, s.Fail(ctx, key, tok, time.Minute))
			corrupt("release "+tok, s.Release(ctx, key, tok))
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			corrupt("complete in tx "+tok, s.CompleteTx(ctx, tx, key, tok, []byte("x"), time.Minute))
			require.NoError(t, tx.Rollback(ctx))
		}
		_, deleted, err := s.DeleteIf(ctx, key, idempotency.StateInProgress, idempotency.StateFailed, idempotency.StateCompleted)
		corrupt("delete if", err)
		assert.False(t, deleted, v.name)
		_, _, _, err = sqlstoretest.Inspect(ctx, s, key)
		corrupt("records", err)
		assert.Equal(t, before, snapshot(key), "%s: nothing rewrote the row", v.name)
	}
}

// TestLongKeyInErrors: an error quotes the start of a long key and its
// length, not the whole of it.
func TestLongKeyInErrors(t *testing.T) {
	pool := testPool(t)
	s, _ := newTable(t, pool)
	key := "long:" + strings.Repeat("k", 1<<20)
	err := s.Complete(context.Background(), key, "t", nil, time.Minute)
	require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	assert.Less(t, len(err.Error()), 200, "the message stays short")
	assert.Contains(t, err.Error(), `"long:kkkk`, "it quotes the key's start")
	assert.Contains(t, err.Error(), "(1048581 bytes)", "and says how long the key is")
}

// Migrate creates the expiry index or says why it cannot: a relation of
// the index's name that is not the table's index (a table named
// <table>_expires_at) makes it fail rather than leave the table without
// it.
func TestMigrateWhenTheIndexNameIsTaken(t *testing.T) {
	pool := testPool(t)
	ctx := context.Background()
	table := uniqueName("pgstore_test_")
	other, err := pgstore.New(pool, pgstore.Config{Table: table + "_expires_at"})
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, pool, table+"_expires_at") })
	require.NoError(t, other.Migrate(ctx))

	s, err := pgstore.New(pool, pgstore.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, pool, table) })
	err = s.Migrate(ctx)
	var indexed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)')`,
		table).Scan(&indexed))
	if !indexed {
		require.Error(t, err, "Migrate left the table without its expiry index")
		assert.Contains(t, err.Error(), table+"_expires_at")
	}
}
