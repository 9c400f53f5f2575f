// Package observertest holds the observer that the tests of the core
// (package idempotency), of the adapters (httpidem, grpcidem) and the
// conformance suite (storetest) record outcomes with, so that it is
// written once. Only tests and storetest import it.
//
// Guarantees: a recorder keeps every call it gets, in the order it got
// them, is safe for concurrent use, and returns copies, so a test reads a
// snapshot that later outcomes do not change.
package observertest
