package testserver

import (
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// DefaultMySQLDSN is the shared MySQL or MariaDB test server, as a
// go-sql-driver/mysql DSN: user root without a password, database test.
// MYSQL_DSN overrides it.
const DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/test"

// MySQLDSN returns the shared MySQL or MariaDB server's DSN (MYSQL_DSN,
// default DefaultMySQLDSN).
func MySQLDSN() string { return Env("MYSQL_DSN", DefaultMySQLDSN) }

// MySQLDB returns a *sql.DB on the shared MySQL or MariaDB server, closed
// when the test ends. It skips under -short and otherwise fails the test
// when the server does not answer within a few seconds: a MySQL-backed test
// never skips silently.
func MySQLDB(t testing.TB) *sql.DB {
	t.Helper()
	if testing.Short() {
		t.Skip("MySQL-backed test left out by -short")
	}
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("MYSQL_DSN: %v", err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("MYSQL_DSN: %v", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() { _ = db.Close() })
	if err := awaitPing(db.PingContext); err != nil {
		t.Fatalf("MySQL or MariaDB is required at %s (database %q; set MYSQL_DSN to change it): %v", cfg.Addr, cfg.DBName, err)
	}
	return db
}
