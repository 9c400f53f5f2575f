package pgstore

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultTable is the table of a Config whose Table is empty.
const DefaultTable = "idempotency_keys"

// indexSuffix makes the name of the table's expiry index from the table's.
const indexSuffix = "_expires_at"

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN-1 bytes);
// longer names are truncated by the server, which could make two tables'
// index names collide, so they are refused instead.
const maxIdentifier = 63

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table is the table that holds the records: a name of lower-case ASCII
	// letters, digits and underscores that does not start with a digit,
	// optionally qualified by a schema name of the same form
	// ("idempotency.keys"). The table name may be at most 52 bytes long, so
	// that the name of its index (the table's plus "_expires_at") fits in
	// PostgreSQL's 63. Names are quoted in every statement, so reserved
	// words are fine. Zero means DefaultTable, unqualified, which resolves
	// through the connection's search_path.
	Table string
}

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	return c
}

// Schema returns the DDL that creates cfg's table and its index, for users
// who run their own migrations: the same SQL that Store.Migrate runs. Zero
// fields of cfg mean their defaults.
func Schema(cfg Config) (string, error) {
	st, err := cfg.withDefaults().statements()
	if err != nil {
		return "", err
	}
	return st.schema, nil
}

// statements validates the (defaulted) table name and builds the store's SQL
// for it.
func (c Config) statements() (statements, error) {
	parts := strings.Split(c.Table, ".")
	if len(parts) > 2 {
		return statements{}, fmt.Errorf("%w: %q has more than one dot", ErrInvalidTable, c.Table)
	}
	table := parts[len(parts)-1]
	for _, p := range parts {
		if !isIdentifier(p) {
			return statements{}, fmt.Errorf("%w: %q: each part must be lower-case ASCII letters, digits and underscores, not starting with a digit, at most %d bytes",
				ErrInvalidTable, c.Table, maxIdentifier)
		}
	}
	if len(table)+len(indexSuffix) > maxIdentifier {
		return statements{}, fmt.Errorf("%w: %q: the table name may be at most %d bytes", ErrInvalidTable, c.Table, maxIdentifier-len(indexSuffix))
	}
	return buildStatements(pgx.Identifier(parts).Sanitize(), pgx.Identifier{table + indexSuffix}.Sanitize()), nil
}

// isIdentifier reports whether s is a plain lower-case SQL identifier: one
// that means the same quoted or not, so users can type it bare in psql.
func isIdentifier(s string) bool {
	if s == "" || len(s) > maxIdentifier {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
