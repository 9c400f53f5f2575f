// Package observertest holds the observers that the tests of the core
// (package idempotency) and of the adapters (httpidem, grpcidem) record
// outcomes with, so that each is written once. Only tests import it.
//
// Guarantees: a recorder keeps every call it gets, in the order it got
// them, is safe for concurrent use, and returns copies, so a test reads a
// snapshot that later outcomes do not change.
package observertest
