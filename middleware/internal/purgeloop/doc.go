// Package purgeloop runs a SQL store's Purge on a schedule: the loop that
// pgstore.Store.PurgeEvery and mysqlstore.Store.PurgeEvery share.
//
// Guarantees: Run purges at once and then every interval until its
// context ends, drains a backlog within one round (it purges again while a
// batch comes back full), survives failing rounds (logged, retried at the
// next), starts no goroutine, and stops its ticker when it returns.
package purgeloop
