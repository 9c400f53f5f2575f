package testserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPostgresURL is the shared test server: trust authentication,
// database test. PG_URL overrides it.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// PostgresURL returns the shared PostgreSQL server's URL (PG_URL, default
// DefaultPostgresURL).
func PostgresURL() string { return Env("PG_URL", DefaultPostgresURL) }

// PostgresPool returns a pool on the shared PostgreSQL server, closed when
// the test ends. It skips under -short and otherwise fails the test when the
// server does not answer within a few seconds: a PostgreSQL-backed test
// never skips silently.
func PostgresPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	if testing.Short() {
		t.Skip("PostgreSQL-backed test left out by -short")
	}
	cfg, err := pgxpool.ParseConfig(PostgresURL())
	if err != nil {
		t.Fatalf("PG_URL: %v", err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("PostgreSQL pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := awaitPing(pool.Ping); err != nil {
		t.Fatalf("PostgreSQL is required at %s:%d (set PG_URL to change it): %v", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool
}

// UniqueName returns prefix plus a random suffix, so that every test run
// has tables (or streams, queues) of its own on a shared server.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
