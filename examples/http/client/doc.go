// Command client pays through the payments API of examples/http over a
// flaky link, with httpidem.Transport: the link loses the API's first
// answer, the Transport sends the payment again with the same
// Idempotency-Key, and the API answers with the payment it already made.
// The program then pays again itself with the key it kept, as after a
// crash, and finds the same payment: one payment for two calls and three
// attempts.
//
//	go run ./examples/http          # the API, in one terminal
//	go run ./examples/http/client   # this client, in another
//
// API_URL names the API (default http://127.0.0.1:8080) and API_KEY the
// caller (default sk_test_client).
package main
