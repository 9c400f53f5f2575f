package mysqlstore

import (
	"context"
	"database/sql"
	"time"
)

// runner runs the store's statements: on the pool, each in its own
// (autocommit) transaction, or inside a caller's transaction.
type runner interface {
	exec(ctx context.Context, query string, args ...any) (sql.Result, error)
	queryRow(ctx context.Context, query string, args ...any) *sql.Row
	// fallback is the statement that reads a refused owner statement's row.
	fallback() string
}

// stmt returns the store's prepared statement of query, preparing it on
// first use. database/sql prepares it again on each connection that runs
// it, once: a statement then costs one round trip, where a query with
// arguments costs two (prepare, execute) unless the DSN sets
// interpolateParams.
func (s *Store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st := s.preparedStmt(query); st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.prepared[query]; ok { // prepared meanwhile by another call
		_ = st.Close()
		return prev, nil
	}
	s.prepared[query] = st
	return st, nil
}

// preparedStmt returns the prepared statement of query, or nil when it was
// not prepared yet.
func (s *Store) preparedStmt(query string) *sql.Stmt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prepared[query]
}

// dbRunner runs each statement on its own, in autocommit. A statement that
// InnoDB chose as a deadlock's victim was rolled back whole, so it is run
// again.
type dbRunner struct{ s *Store }

func (d dbRunner) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := d.s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		res, err := st.ExecContext(ctx, args...)
		if err == nil || !isDeadlock(err) || i == maxDeadlockRetries {
			return res, err
		}
		if !sleepCtx(ctx, deadlockRetryBaseDelay<<i) {
			return nil, err
		}
	}
}

func (d dbRunner) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := d.s.stmt(ctx, query)
	if err != nil {
		// A *sql.Row cannot be made with an error; the same query unprepared
		// reports the same error through Scan.
		return d.s.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (d dbRunner) fallback() string { return d.s.sql.fallback }

// txRunner runs the statements in the caller's transaction, on its
// connection only: through the store's prepared statement when there is one
// (database/sql reuses it when it was prepared on that connection, and
// prepares it there otherwise), else as a plain query. It never takes a
// second connection from the pool, which a pool whose every connection
// holds a handler's transaction could not give. Nothing is retried: a
// deadlock rolled the whole transaction back.
//
// A transaction of another *sql.DB (a second pool on the same server)
// cannot use the store's statements: database/sql refuses them before
// sending anything, and the statement then runs as a plain query.
type txRunner struct {
	s  *Store
	tx *sql.Tx
}

func (t txRunner) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := t.s.preparedStmt(query); st != nil {
		txst := t.tx.StmtContext(ctx, st)
		res, err := txst.ExecContext(ctx, args...)
		if !refused(txst, err) {
			return res, err
		}
	}
	return t.tx.ExecContext(ctx, query, args...)
}

func (t txRunner) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	if st := t.s.preparedStmt(query); st != nil {
		txst := t.tx.StmtContext(ctx, st)
		if row := txst.QueryRowContext(ctx, args...); !refused(txst, row.Err()) {
			return row
		}
	}
	return t.tx.QueryRowContext(ctx, query, args...)
}

// refused reports whether err is the error that database/sql gave st in
// place of a statement (one of another pool, say), so nothing was sent:
// such a Stmt answers every call, Close too, with that one error.
func refused(st *sql.Stmt, err error) bool { return err != nil && st.Close() == err }

func (t txRunner) fallback() string { return t.s.sql.fallbackLocked }

// sleepCtx sleeps for d, or until ctx ends; it reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
