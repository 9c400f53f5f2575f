// Package benchref holds what the benchmarks compare the idempotency
// middleware against and that exists nowhere else: a naive Redis
// check-then-set deduplicator. It is a cost reference, internal so that
// nobody builds on it.
package benchref
