// Package adapter holds what the adapters of the owner protocol share,
// written once: the stored key (StoreKey, used by package idempotency's
// Watermill middleware and by packages httpidem and grpcidem), the rules
// for a client's key, the fingerprint's hash, the reader of a stored
// answer's binary record, and what a handler's panic does.
//
// What a key, an answer or an outcome means on the wire (a header or
// metadata, a status code, a problem body) stays in each adapter.
//
// Guarantees: no two (scope, key) pairs share a stored key under one
// prefix; a hashed scope never appears in one; a key longer than
// MaxKeyLength is hashed, never refused; the fingerprint of given fields
// never changes; a damaged record is an error, never a partial answer; a
// panicking handler leaves its key FAILED.
//
// It imports nothing of this module, so that package idempotency imports
// it.
package adapter
