package mysqlstore

import (
	"fmt"
	"strings"
)

// DefaultTable is the table of a Config whose Table is empty.
const DefaultTable = "idempotency_keys"

// constraintSuffix makes the name of the table's CHECK constraint from the
// table's: MySQL names constraints per database, not per table, so two
// tables of the store in one database need two names.
const constraintSuffix = "_record_valid"

// maxIdentifier is the length of a MySQL and MariaDB identifier, in
// characters (here bytes: only ASCII is accepted).
const maxIdentifier = 64

// Config configures a Store. The zero Config is valid.
type Config struct {
	// Table is the table that holds the records: a name of lower-case ASCII
	// letters, digits and underscores that does not start with a digit,
	// optionally qualified by a database name of the same form
	// ("idempotency.keys"). The table name may be at most 51 bytes long, so
	// that the name of its CHECK constraint (the table's plus
	// "_record_valid") fits in 64. Names are quoted in every statement, so
	// reserved words are fine. Zero means DefaultTable, in the connection's
	// current database.
	Table string
}

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	return c
}

// Schema returns the DDL that creates cfg's table, with its index and CHECK
// constraint, for users who run their own migrations: the same SQL that
// Store.Migrate runs. Zero fields of cfg mean their defaults.
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
	if len(table)+len(constraintSuffix) > maxIdentifier {
		return statements{}, fmt.Errorf("%w: %q: the table name may be at most %d bytes", ErrInvalidTable, c.Table, maxIdentifier-len(constraintSuffix))
	}
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = quote(p)
	}
	return buildStatements(strings.Join(quoted, "."), quote(table+constraintSuffix)), nil
}

// quote returns a validated identifier in backquotes.
func quote(name string) string { return "`" + name + "`" }

// isIdentifier reports whether s is a plain lower-case SQL identifier: one
// that means the same quoted or not, whatever lower_case_table_names is.
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
