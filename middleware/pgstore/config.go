package pgstore

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency/watermill-idempotency/middleware/internal/sqlstore"
)

// indexSuffix makes the name of the table's expiry index from the table's.
const indexSuffix = "_expires_at"

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN-1 bytes);
// longer names are truncated by the server, which could make two tables'
// index names collide, so they are refused instead.
const maxIdentifier = 63

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table holds the records: lower-case ASCII letters, digits and
	// underscores, not starting with a digit, at most 52 bytes (its index
	// adds "_expires_at" within PostgreSQL's 63), optionally qualified by a
	// schema of the same form ("idempotency.keys"). Names are quoted in
	// every statement. The default is idempotency_keys, resolved through
	// the connection's search_path.
	Table string
}

// Schema returns the DDL that creates cfg's table and its index, for your
// own migrations: the SQL that [Store.Migrate] runs.
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
	parts, err := sqlstore.ParseTable(c.Table, maxIdentifier, indexSuffix)
	if err != nil {
		return statements{}, "", wrapTable(err)
	}
	table := parts[len(parts)-1]
	return buildStatements(pgx.Identifier(parts).Sanitize(), pgx.Identifier{table + indexSuffix}.Sanitize()), c.Table, nil
}

func wrapTable(err error) error { return fmt.Errorf("pgstore: %w", err) }
