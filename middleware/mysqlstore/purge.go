package mysqlstore

import (
	"context"
	"database/sql"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// PurgeEvery deletes expired records at once and then every interval,
// until ctx ends; it returns nil then. Run it in one goroutine per process:
//
//	go func() { _ = store.PurgeEvery(ctx, 5*time.Minute, 1000, logger) }()
//
// Expired records already read as absent; purging reclaims their space.
// Each round deletes batch rows per statement, oldest expiry first, again
// while a batch comes back full. Each statement is a short READ COMMITTED
// transaction that locks expired rows, skipping those locked by others,
// and deletes them one by one: it waits for no one, so no claim queues
// behind it. A
// row a claim revived is kept; any number of processes may purge at once. A failed round is logged at Error (a nil logger logs
// nothing) and retried at the next. It returns an error at once for a
// batch below 1 or an interval below 1 ns. A batch of a few thousand
// keeps each transaction well under a second.
func (s *Store) PurgeEvery(ctx context.Context, interval time.Duration, batch int, logger watermill.LoggerAdapter) error {
	return s.d.PurgeEvery(ctx, interval, batch, logger)
}

// deleteExpired is one purge of up to batch expired rows (see purgeSQL): it
// returns how many it deleted. It deletes the rows one by one, by primary
// key: a DELETE of many keys may be run as a scan of the table (the
// optimizer's choice when they are most of it), which waits for every row
// that others hold locked.
func (s *Store) deleteExpired(ctx context.Context, batch int) (int64, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, s.sql.purge, batch)
	if err != nil {
		return 0, err
	}
	var hashes [][]byte
	for rows.Next() {
		var h []byte
		if err := rows.Scan(&h); err != nil {
			_ = rows.Close()
			return 0, err
		}
		hashes = append(hashes, h)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(hashes) == 0 {
		return 0, tx.Commit()
	}
	del, err := tx.PrepareContext(ctx, s.sql.del)
	if err != nil {
		return 0, err
	}
	defer func() { _ = del.Close() }()
	for _, h := range hashes {
		if _, err := del.ExecContext(ctx, h); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return int64(len(hashes)), nil
}
