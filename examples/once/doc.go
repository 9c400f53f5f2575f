// Command once runs Once.Do outside Watermill: a nightly invoicing job that
// several workers run at the same time, as a cron job on every replica
// would, where each invoice must be sent exactly once.
//
//	go run ./examples/once                     # in-memory store, no server
//	REDIS_ADDR=localhost:6379 go run ./examples/once
//
// Four workers walk the same list of customers. For each one they call
// Do with the key "invoice:<month>:<customer>": the first worker to claim a
// key sends the invoice and its receipt is stored; a worker that finds the
// key in progress moves on and comes back to it; a worker that finds it
// completed gets the stored receipt back (Replayed). The first attempt for
// some customers fails, and a later call runs it again. The last line checks
// that every invoice was sent exactly once.
package main
