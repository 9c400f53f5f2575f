package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// offlinePool is a pool that never connects (nothing listens on port 1):
// New does not contact the server, so its checks run without one.
func offlinePool(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestNewRejectsANilPool(t *testing.T) {
	s, err := pgstore.New(nil, pgstore.Config{})
	assert.ErrorIs(t, err, pgstore.ErrNilPool)
	assert.Nil(t, s)
}

func TestTableNames(t *testing.T) {
	pool := offlinePool(t)
	long := strings.Repeat("t", 52) // 52 + len("_expires_at") = 63
	for _, tc := range []struct {
		table       string
		ok          bool
		quoted, idx string
	}{
		{"", true, `"idempotency_keys"`, `"idempotency_keys_expires_at"`},
		{"idempotency_keys", true, `"idempotency_keys"`, `"idempotency_keys_expires_at"`},
		{"app.keys", true, `"app"."keys"`, `"keys_expires_at"`},
		{"_k1", true, `"_k1"`, `"_k1_expires_at"`},
		{"order", true, `"order"`, `"order_expires_at"`}, // a reserved word: quoted
		{long, true, `"` + long + `"`, `"` + long + `_expires_at"`},
		{strings.Repeat("s", 63) + ".keys", true, `"` + strings.Repeat("s", 63) + `"."keys"`, `"keys_expires_at"`},
		{long + "t", false, "", ""},                        // the index name would not fit
		{strings.Repeat("s", 64) + ".keys", false, "", ""}, // the schema name does not fit
		{"Keys", false, "", ""},                            // folded to keys when bare: refused, not guessed
		{"1keys", false, "", ""},
		{"a.b.c", false, "", ""},
		{".keys", false, "", ""},
		{"app.", false, "", ""},
		{"my-keys", false, "", ""},
		{"my keys", false, "", ""},
		{`k"; DROP TABLE x; --`, false, "", ""},
		{"kéys", false, "", ""},
	} {
		s, err := pgstore.New(pool, pgstore.Config{Table: tc.table})
		ddl, serr := pgstore.Schema(pgstore.Config{Table: tc.table})
		if !tc.ok {
			assert.ErrorIs(t, err, pgstore.ErrInvalidTable, "New %q", tc.table)
			assert.ErrorIs(t, serr, pgstore.ErrInvalidTable, "Schema %q", tc.table)
			assert.Nil(t, s)
			continue
		}
		require.NoError(t, err, tc.table)
		require.NoError(t, serr, tc.table)
		assert.Equal(t, ddl, s.Schema(), "Schema(cfg) and Store.Schema agree")
		assert.Contains(t, ddl, "CREATE TABLE IF NOT EXISTS "+tc.quoted+" (", tc.table)
		assert.Contains(t, ddl, "CREATE INDEX IF NOT EXISTS "+tc.idx+" ON "+tc.quoted+" (expires_at)", tc.table)
	}
}
