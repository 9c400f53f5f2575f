// Command quickstart shows the idempotency middleware at work with no server
// at all: an in-process Go channel as the broker and the in-memory store.
//
//	go run ./examples/quickstart
//
// It publishes a batch in which every order appears several times (some
// copies with the same UUID, some with a new UUID and the same requestId),
// makes some first attempts fail, and prints what the middleware did with
// each delivery. The last line checks the ledger of side effects: every
// order was charged exactly once.
package main
