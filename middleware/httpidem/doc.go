// Package httpidem is an HTTP middleware that gives POST and PATCH endpoints
// exactly-once effects per Idempotency-Key, following the IETF draft "The
// Idempotency-Key HTTP Header Field" and Stripe's documented behaviour. It
// keeps its state in the same middleware.Store as the Watermill middleware
// (Redis in production, memstore for tests and demos), so any number of
// server processes sharing that store behave as one.
//
//	idem, err := httpidem.New(httpidem.Config{
//		Store: store,
//		Scope: func(r *http.Request) string { return apiKeyID(r) },
//	}, logger)
//	...
//	http.Handle("POST /payments", idem.Handler(payments))
//
// # What a request gets
//
// Requests whose method is not in Config.Methods (POST and PATCH by default)
// pass through untouched. For the others:
//
//	first request with a key          handler runs; its response is stored
//	repeat after it completed         stored status, headers and body, byte for
//	                                  byte, plus Idempotent-Replayed: true
//	repeat while it is still running  409, Retry-After
//	same key, different request       422 (method, path, query or body differ)
//	no Idempotency-Key                400 (unless Config.KeyOptional)
//	invalid key                       400: empty, over 255 bytes, a byte outside
//	                                  printable ASCII, or the header twice
//	request body over 10 MiB          413, nothing is claimed
//	store unreachable, or no answer   503, Retry-After; the handler does not run
//	within Config.StoreTimeout (5 s)  (Config.FailOpen runs it without
//	                                  idempotency and logs, unless the client
//	                                  is already gone)
//	repeat of a response over 1 MiB   410 (see below)
//
// Every answer of the middleware itself is an RFC 9457 problem
// (application/problem+json with type, title, status and detail); its type is
// Config.ProblemTypeBase plus a ProblemType, whose documentation says what it
// means and what the client should do.
//
// # Keys
//
// The key is the Idempotency-Key header's value as sent (Stripe's form), or,
// when it starts with a double quote, the content of an RFC 8941 string (the
// draft's form, Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"):
// both forms of one key are the same key. A key is 1 to 255 bytes
// (Config.MaxKeyLength) of printable ASCII, 0x20 to 0x7E.
//
// Keys belong to a scope, Config.Scope(r): the authenticated subject or API
// key of the caller. The stored key is the prefix, the scope's length, the
// scope and the key ("httpidem:5:alice:k1"), so no two (scope, key) pairs
// meet, whatever bytes they hold, and a client can never receive another
// scope's response. Without a Scope every request shares one scope: use that
// only for a single client.
//
// The request's fingerprint is SHA-256 over its method, path, raw query and
// the SHA-256 of its body. It is given to Store.Claim and kept with the key;
// a repeat whose fingerprint differs is answered 422 and never sees the
// stored response. To hash the body the middleware reads it in full, up to
// Config.MaxRequestBody, and hands the handler an identical copy.
//
// # Outcomes
//
// The first request claims the key (IN_PROGRESS, with a 40 s lease renewed
// every lease/3 while the handler runs, every lease/10 after a renewal
// failed) and runs the handler, whose response goes to the client as it is
// written and is recorded on the side:
//
//   - 2xx, 3xx and 4xx: the key is COMPLETED for 24 h with the status, the
//     headers the handler set and the body, in a compact binary encoding. 4xx
//     answers are outcomes too (Stripe replays them): fix the request and use
//     a new key. Put rate limiting (429) outside this middleware, so it is
//     never stored.
//   - 5xx: the key is FAILED (kept 24 h with its fingerprint): a retry with the
//     same request runs the handler again.
//   - no answer at all, after the handler's context ended: the handler
//     returned without calling WriteHeader, Write or Flush once its client
//     left or its lease was lost. It was interrupted, and net/http's empty
//     200 is not an outcome: the key is FAILED, and a retry runs the handler
//     again. A handler that finished its effect should say so with a
//     status, even when nobody listens any more.
//   - panic: the key is FAILED, then the panic goes on unchanged to the
//     outer recovery middleware or to net/http, exactly as without this
//     middleware. It is not turned into a 500 here: the outer layer decides
//     how a panic is answered and logged.
//
// Headers set by outer middleware before the handler ran (a request id, say)
// are not the handler's: they are neither stored nor replayed, and a replay
// keeps the ones set for the repeat. Hop-by-hop headers and trailers are not
// stored. When the handler sets no Content-Type, the middleware sets the one
// net/http would sniff, so the replay carries the same one. A handler cannot
// hijack the connection under this middleware.
//
// A response body larger than Config.MaxResponseBody (1 MiB) reaches the
// first client in full, and the key is completed without it. Repeats are
// answered 410 Gone (ProblemResponseNotStored, with the original status):
// the effect happened, but the response cannot be replayed. Not 409, which
// clients retry, nor 422, which means a misused key; and never a partial
// 2xx that would look like a replay.
//
// If the lease is lost while the handler runs, the handler's context is
// cancelled with a cause matching middleware.ErrLeaseLost
// (context.Cause(r.Context())): when the store reports it (the key was
// deleted, or taken over), and, while renewals keep failing, no later than
// the lease's end counted from the start of the last claim or renewal that
// succeeded. The store counts the lease from when that call reached it, so
// the handler is told before another request can claim the key. Handlers
// should pass their context to the effect, so that it stops.
//
// Every store call is bounded by Config.StoreTimeout: the claim, each
// renewal (also by lease/3; one that is still running when the handler
// returns is abandoned, so a hanging store never holds the response), and
// each attempt to record the outcome. Recording runs whether or not the
// client is still there. If recording COMPLETED fails after the handler
// succeeded, the middleware flushes the response to the client and retries
// with backoff until the lease runs out: giving up early would let a retry
// run the effect again once the lease expires. Only the end of the response
// waits meanwhile. A failure to record FAILED is logged and not retried: the
// lease expiring has the same effect.
//
// # Guarantees
//
// As long as the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time, and,
//     once it answered 2xx to 4xx, never again while the record is kept
//     (Config.CompletedTTL).
//   - A repeat gets the first response byte for byte, 409 while it runs, or
//     422 if it is a different request. A client never gets a 2xx that its
//     own request's handler did not produce, other than a replay of the
//     response stored for its own scope, key and fingerprint.
//   - With the store down, nothing runs unless FailOpen is set.
//
// Not guaranteed: a server that crashes mid-handler stops renewing, and
// after the lease a retry runs the handler again; a handler that outlives a
// lost lease may overlap with the retry that took over. Effects outside the
// store (a charge at a bank, a row in a database) are exactly-once only when
// that effect is itself idempotent or transactional (pass the key to the
// bank; write the row and a unique key in one transaction). This middleware
// removes the duplicates that retries cause; it cannot undo a crash halfway
// through an effect.
package httpidem
