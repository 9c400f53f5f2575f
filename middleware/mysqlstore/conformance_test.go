package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idempotency/watermill-idempotency/middleware/storetest"
)

// TestConformance runs the whole storetest suite, the owner protocol's Once
// cases included, on one table shared by its parallel subtests, as a
// service's consumers share one.
func TestConformance(t *testing.T) {
	db := testDB(t)
	s, table := newTable(t, db)
	var drop sync.Once
	storetest.Run(t, func(t *testing.T) storetest.Subject {
		return storetest.Subject{Store: s, PutForeign: func(key string, kind string) error {
			// The table's CHECK constraint refuses every foreign row, which is
			// what it is for; a table created by someone else may lack it, and
			// the store must hold without it. The suite's other cases go on
			// on the unconstrained table, which changes nothing for rows the
			// store writes.
			var err error
			drop.Do(func() {
				_, err = db.ExecContext(context.Background(),
					"ALTER TABLE "+quoted(table)+" DROP CONSTRAINT "+quoted(table+"_record_valid"))
			})
			if err != nil {
				return err
			}
			return putForeign(db, table, key, kind)
		}}
	})
}

// The foreign rows of storetest's corrupt-record case. A table has typed
// columns, so "a value of another kind" is a row whose values no record of
// the store's has:
//
//	short-string  state '1': a short string that is no state
//	long-string   state a 100-byte sentence
//	json          state a JSON document, as another program's encoding
//	wrong-type    'completed' shaped like an IN_PROGRESS row: a token, a
//	              live lease, no result (a row of another state's type)
//	bad-fields    'in_progress' with attempts 0, no token and no lease
//
// Each otherwise looks like a live COMPLETED row (an expiry an hour ahead,
// a result), so a store that skipped the check would take it for a
// duplicate.
var foreignRows = map[string]string{
	"short-string": `'1', 'tok', 1, 'x', NULL, NULL`,
	"long-string":  `'` + strings.Repeat("not a record, ", 8)[:100] + `', 'tok', 1, 'x', NULL, NULL`,
	"json":         `'{"state":"completed","attempts":1}', 'tok', 1, 'x', NULL, NULL`,
	"wrong-type":   `'completed', 'tok', 1, NULL, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 1000000`,
	"bad-fields":   `'in_progress', NULL, 0, NULL, NULL, NULL`,
}

// putForeign inserts the foreign row of kind under key, as a bug or another
// program would: key_hash is the SHA-256 of the key, as the package documents.
func putForeign(db *sql.DB, table, key string, kind string) error {
	values, ok := foreignRows[kind]
	if !ok {
		return fmt.Errorf("putForeign: unknown kind %v", kind)
	}
	_, err := db.ExecContext(context.Background(), `INSERT INTO `+quoted(table)+`
		(key_hash, `+"`key`"+`, state, token, attempts, result, lease_until, claim_ttl_us, created_at, updated_at, expires_at)
		VALUES (UNHEX(SHA2(?, 256)), ?, `+values+`, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)`,
		[]byte(key), []byte(key))
	return err
}

// TestConformanceUnderSimultaneousAssignment runs the suite again on
// sessions in sql_mode 'ANSI,SIMULTANEOUS_ASSIGNMENT': MariaDB's standard
// UPDATE, whose SET list reads the old row throughout (MySQL's reads each
// assignment's new value in the ones after it), with ANSI's double-quoted
// identifiers and no strict mode. The statements must mean the same under
// both.
func TestConformanceUnderSimultaneousAssignment(t *testing.T) {
	db := dbWith(t, map[string]string{"sql_mode": "'ANSI,SIMULTANEOUS_ASSIGNMENT'"})
	if err := db.PingContext(context.Background()); mysqlErrno(err) == 1231 { // ER_WRONG_VALUE_FOR_VAR
		t.Skipf("this server has no SIMULTANEOUS_ASSIGNMENT (MySQL): %v", err)
	}
	s, _ := newTable(t, db)
	storetest.Run(t, func(t *testing.T) storetest.Subject { return storetest.Subject{Store: s} })
}
