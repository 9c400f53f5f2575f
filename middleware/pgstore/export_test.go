package pgstore

import "github.com/jackc/pgx/v5"

// Columns is the column list every statement returns, for the alias r.
const Columns = columns

// ValidSQL is the record's invariant as an SQL condition on alias.
func ValidSQL(alias string) string { return valid(alias) }

// CheckScan scans extra then a record's Columns from row and returns what
// the store's decoding says of the record: nil for a well-formed one.
func CheckScan(src pgx.Row, extra ...any) (checkErr, scanErr error) {
	var r row
	if err := src.Scan(append(extra, r.dest()...)...); err != nil {
		return nil, err
	}
	return r.Check(), nil
}
