package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
)

// TestApplyPoolSettings: a pool configured for a 40 s lease has sessions
// whose idle_in_transaction_session_timeout is 20 s; a value in the
// connection string is kept; a negative lease is refused.
func TestApplyPoolSettings(t *testing.T) {
	testPool(t) // fails when the server is down, skips under -short
	show := func(cfg *pgxpool.Config) string {
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		defer pool.Close()
		var v string
		require.NoError(t, pool.QueryRow(context.Background(), "SHOW idle_in_transaction_session_timeout").Scan(&v))
		return v
	}
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL())
	require.NoError(t, err)
	require.NoError(t, pgstore.ApplyPoolSettings(cfg, 40*time.Second))
	assert.Equal(t, "20s", show(cfg))

	cfg, err = pgxpool.ParseConfig(testserver.PostgresURL())
	require.NoError(t, err)
	require.NoError(t, pgstore.ApplyPoolSettings(cfg, 0))
	assert.Equal(t, "20s", show(cfg), "zero is the default lease, 40 s")

	cfg, err = pgxpool.ParseConfig(testserver.PostgresURL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams[pgstore.SessionTimeoutParam] = "5000"
	require.NoError(t, pgstore.ApplyPoolSettings(cfg, 40*time.Second))
	assert.Equal(t, "5s", show(cfg), "the user's own value is kept")

	require.Error(t, pgstore.ApplyPoolSettings(cfg, -time.Second))
	require.Error(t, pgstore.ApplyPoolSettings(nil, time.Second))
}
