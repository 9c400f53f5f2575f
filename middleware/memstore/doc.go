// Package memstore is an in-process middleware.Store: the same state machine
// and guarantees as the Redis store, for one process only.
//
// It is the embedded default of the examples and of tests that need no
// server. It is never a silent default for production: its records live in
// one process's memory, so two consumers (or one restarted consumer) do not
// see each other's keys, and a crash loses every COMPLETED record.
//
// Guarantees:
//   - Every transition is atomic under one mutex; exactly one of any number of
//     concurrent claimers acquires a key.
//   - Expiry is by the injected clock (Config.Now), checked on every read, so
//     tests move time instead of sleeping.
//   - Memory stays bounded under a stream of unique keys: every write also
//     reclaims the records whose expiry has passed, oldest first, from a heap.
//     No goroutine is started; Close only marks the store closed.
package memstore
