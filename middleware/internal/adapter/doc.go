// Package adapter holds what the adapters of the owner protocol share: the
// stored key (also the Watermill middleware's), the rules of a client's
// key, the fingerprint's hash, the reader of a stored answer, the table of
// the adapters' own answers, and what a handler's panic does. Package
// serve, below it, is the claim-to-answer flow of httpidem and grpcidem.
//
// Guarantees: no two (scope, key) pairs share a stored key under one
// prefix; a hashed scope never appears in one; a long key is hashed, never
// refused; the fingerprint of given fields never changes; a damaged record
// is an error, never a partial answer; a panicking handler leaves its key
// FAILED.
//
// It imports nothing of this module but internal/configerr, so that
// package idempotency imports it.
package adapter
