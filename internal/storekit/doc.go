// Package storekit is what the module's stores share with package
// idempotency: argument checks, TTL clamping, owner tokens, the run a
// transactional completion writes for, and the encoding of a Watermill
// handler's stored output. A store outside the module needs none of it.
package storekit
