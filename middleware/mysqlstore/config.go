package mysqlstore

import (
	"fmt"
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// constraintSuffix makes the name of the table's CHECK constraint from the
// table's: MySQL names constraints per database, not per table, so two
// tables of the store in one database need two names.
const constraintSuffix = "_record_valid"

// maxIdentifier is the length of a MySQL and MariaDB identifier, in
// characters (here bytes: only ASCII is accepted).
const maxIdentifier = 64

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table holds the records: lower-case ASCII letters, digits and
	// underscores, not starting with a digit, at most 51 bytes (its CHECK
	// constraint adds "_record_valid" within 64), optionally qualified by a
	// database of the same form ("idempotency.keys"). Names are quoted in
	// every statement. The default is idempotency_keys, in the
	// connection's current database.
	Table string
}

// Schema returns the DDL that creates cfg's table, with its index and CHECK
// constraint, for your own migrations: the SQL that [Store.Migrate] runs.
func Schema(cfg Config) (string, error) {
	st, _, err := cfg.statements()
	if err != nil {
		return "", err
	}
	return st.schema, nil
}

// statements validates the table name and builds the store's SQL for it,
// and returns the table as configured.
func (c Config) statements() (statements, string, error) {
	if c.Table == "" {
		c.Table = sqlstore.DefaultTable
	}
	parts, err := sqlstore.ParseTable(c.Table, maxIdentifier, constraintSuffix)
	if err != nil {
		return statements{}, "", fmt.Errorf("mysqlstore: %w", err)
	}
	return buildStatements(quoteTable(c.Table), quote(parts[len(parts)-1]+constraintSuffix)), c.Table, nil
}

// quote returns a validated identifier in backquotes.
func quote(name string) string { return "`" + name + "`" }

// quoteTable returns a validated, optionally qualified, table name quoted.
func quoteTable(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = quote(p)
	}
	return strings.Join(parts, ".")
}
