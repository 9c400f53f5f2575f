package mysqlstore

import (
	"context"
	"database/sql"
	"time"
)

// runner runs statements on the pool (autocommit) or in a caller's transaction.
type runner interface {
	exec(ctx context.Context, query string, args ...any) (sql.Result, error)
	queryRow(ctx context.Context, query string, args ...any) *sql.Row
	// fallback is the statement that reads a refused owner statement's row.
	fallback() string
}

// stmt returns query's statement, prepared on first use: one round trip, not two.
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

func (s *Store) preparedStmt(query string) *sql.Stmt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prepared[query]
}

// dbRunner runs each statement in autocommit; a deadlock's victim is run again.
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
		// The unprepared query reports the same error through Scan.
		return d.s.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (d dbRunner) fallback() string { return d.s.sql.fallback }

// txRunner runs on the transaction's connection only (a full pool has no
// other), by the prepared statement if accepted. Nothing is retried.
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

// refused reports that database/sql refused st (another pool's): nothing was sent.
func refused(st *sql.Stmt, err error) bool { return err != nil && st.Close() == err }

func (t txRunner) fallback() string { return t.s.sql.fallbackLocked }

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
