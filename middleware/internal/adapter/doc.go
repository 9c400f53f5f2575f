// Package adapter holds what the request/response adapters of the owner
// protocol (package httpidem for HTTP, package grpcidem for gRPC) share,
// written once: the settings their Configs have in common, with their
// defaults, their checks and the idempotency.Once built from them; the rules
// for a client's key, the stored key with its hashed scope, and the
// fingerprint's hash; the reader of a stored answer's binary record; the
// level at which each outcome is logged; and what a handler's panic does.
//
// What a key, an answer or an outcome means on the wire (a header or
// metadata, a status code, a problem body) stays in each adapter.
//
// Guarantees: no two (scope, key) pairs share a stored key, and no scope
// appears in one; the fingerprint of given fields never changes, so
// records stored by an earlier release still match; a damaged record is
// an error, never a partial answer; a panicking handler leaves its key
// FAILED; Check reports every problem of the shared settings, each
// matching the adapter's ErrInvalidConfig.
package adapter
