// Command http is a small payments API whose POST /payments is made
// idempotent by the Idempotency-Key middleware (package httpidem): a client
// that retries after a timeout is never charged twice.
//
//	go run ./examples/http                                  # in-memory store
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/http  # shared Redis store
//
// It listens on ADDR (default 127.0.0.1:8080). Every request needs
// "Authorization: Bearer <api key>"; the API key is the idempotency scope, so
// two clients may use the same Idempotency-Key without meeting. Each payment
// is published to a receipts consumer with httpidem.ForwardKey as its
// requestId, so the consumer sends one receipt per payment. See README.md
// for a curl session.
package main
