package mysqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstoretest"
)

// corruptVariants are rows that violate one invariant each, over the
// columns (state, token, attempts, result, lease_until, claim_ttl_us,
// created_at, updated_at, expires_at). Every row has token 'tok' where it
// has one, and a live lease where it has one, so that an owner call with
// 'tok' would apply if the store did not check the row.
var corruptVariants = []struct{ name, values string }{
	{"no-state", `NULL, 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"unknown-state", `'IN_PROGRESS', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"padded-state", `'in_progress ', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"no-attempts", `'in_progress', 'tok', NULL, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"zero-attempts", `'in_progress', 'tok', 0, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"negative-attempts", `'completed', 'tok', -1, 'r', NULL, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"no-created", `'in_progress', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, NULL, {now}, {now} + INTERVAL 2 HOUR`},
	{"no-updated", `'completed', 'tok', 1, 'r', NULL, NULL, {now}, NULL, {now} + INTERVAL 1 HOUR`},
	{"no-expiry", `'in_progress', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, NULL`},
	{"in_progress-no-token", `'in_progress', NULL, 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"in_progress-empty-token", `'in_progress', '', 1, NULL, {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"in_progress-no-lease", `'in_progress', 'tok', 1, NULL, NULL, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"in_progress-no-ttl", `'in_progress', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, NULL, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"in_progress-zero-ttl", `'in_progress', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, 0, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"in_progress-result", `'in_progress', 'tok', 1, 'r', {now} + INTERVAL 1 HOUR, 1000000, {now}, {now}, {now} + INTERVAL 2 HOUR`},
	{"completed-no-token", `'completed', NULL, 1, 'r', NULL, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"completed-empty-token", `'completed', '', 1, 'r', NULL, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"completed-lease", `'completed', 'tok', 1, 'r', {now} + INTERVAL 1 HOUR, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"completed-ttl", `'completed', 'tok', 1, 'r', NULL, 1000000, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"completed-no-result", `'completed', 'tok', 1, NULL, NULL, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"failed-lease", `'failed', 'tok', 1, NULL, {now} + INTERVAL 1 HOUR, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"failed-ttl", `'failed', 'tok', 1, NULL, NULL, 1000000, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"failed-result", `'failed', 'tok', 1, 'r', NULL, NULL, {now}, {now}, {now} + INTERVAL 1 HOUR`},
	{"expired-corrupt", `'in_progress', NULL, 0, NULL, NULL, NULL, {now}, {now}, {now} - INTERVAL 1 HOUR`},
}

// TestCorruptVariants writes each variant into a table without any
// constraint but its primary key, as a table made by someone else may be:
// every method, the in-transaction completion, DeleteIf and Records report
// it as ErrCorruptRecord, and none rewrites or deletes it.
func TestCorruptVariants(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	s, table := newTable(t, db)
	q := quoted(table)
	for _, ddl := range []string{
		"ALTER TABLE " + q + " DROP CONSTRAINT " + quoted(table+"_record_valid"),
		"ALTER TABLE " + q + " MODIFY state VARBINARY(255) NULL, MODIFY attempts BIGINT NULL, MODIFY created_at DATETIME(6) NULL," +
			" MODIFY updated_at DATETIME(6) NULL, MODIFY expires_at DATETIME(6) NULL",
	} {
		_, err := db.ExecContext(ctx, ddl)
		require.NoError(t, err)
	}
	snapshot := func(key string) string {
		var text string
		require.NoError(t, db.QueryRowContext(ctx, "SELECT CONCAT_WS('|', HEX(state), HEX(token), attempts, HEX(result), lease_until,"+
			" claim_ttl_us, created_at, updated_at, expires_at, 'x') FROM "+q+" WHERE `key` = ?", []byte(key)).Scan(&text))
		return text
	}
	for _, v := range corruptVariants {
		key := "variant:" + v.name
		_, err := db.ExecContext(ctx, "INSERT INTO "+q+" (key_hash, `key`, state, token, attempts, result, lease_until,"+
			" claim_ttl_us, created_at, updated_at, expires_at) VALUES (UNHEX(SHA2(?, 256)), ?, "+
			strings.ReplaceAll(v.values, "{now}", "UTC_TIMESTAMP(6)")+")", []byte(key), []byte(key))
		require.NoError(t, err, v.name)
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
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			corrupt("complete in tx "+tok, s.CompleteTx(ctx, tx, key, tok, []byte("x"), time.Minute))
			require.NoError(t, tx.Rollback())
		}
		_, deleted, err := s.DeleteIf(ctx, key, idempotency.StateInProgress, idempotency.StateFailed, idempotency.StateCompleted)
		corrupt("delete if", err)
		assert.False(t, deleted, v.name)
		_, _, _, err = sqlstoretest.Inspect(ctx, s, key)
		corrupt("records", err)
		assert.Equal(t, before, snapshot(key), "%s: nothing rewrote the row", v.name)
	}
}
