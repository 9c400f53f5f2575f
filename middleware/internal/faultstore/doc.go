// Package faultstore wraps an idempotency.Store and makes chosen calls
// misbehave as a store behind a network does: hang until the caller gives
// up, fail, answer late, apply a call and lose its reply. The tests of the
// core (package idempotency) and of the adapters (httpidem, grpcidem) share
// it, so that each fault is written once. Only tests import it.
//
// Guarantees:
//   - A call whose operation has no Fault goes to the wrapped store
//     unchanged, with the caller's context; Get and Delete always do.
//   - A Fault sees the caller's context and decides whether the wrapped
//     store is called at all (Call.Pass) and what the caller is told.
//   - Store keeps the wrapped store behind the idempotency.Store interface,
//     so a wrapped memstore loses its in-process mark: the owner protocol
//     times and guards its calls like those of any network store, which is
//     what a fault test wants.
//   - Store is safe for concurrent use; Calls counts every call of an
//     operation, whether the Fault passed it on or not.
package faultstore
