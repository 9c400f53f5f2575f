// Package httpidem is an HTTP middleware that gives POST and PATCH endpoints
// exactly-once effects per Idempotency-Key, following the IETF draft "The
// Idempotency-Key HTTP Header Field" and Stripe's documented behaviour. It
// keeps its state in the same idempotency.Store as the Watermill middleware
// (Redis in production, memstore for tests and demos), and runs on the same
// owner protocol (idempotency.Once), so any number of server processes
// sharing that store behave as one. As in every adapter of this module
// (see Names in package idempotency), New returns a *Middleware, plugged
// in by the method named after what net/http takes: Handler, a
// func(http.Handler) http.Handler. For the caller, Transport is an
// http.RoundTripper that sends each POST and PATCH with a key and retries it
// safely (see The client side).
//
//	idem, err := httpidem.New(httpidem.Config{
//		Store: store,
//		Scope: func(r *http.Request) string { return apiKeyID(r) },
//	}, logger)
//	...
//	mux.Handle("POST /payments", idem.Handler(payments))
//
//	t, err := httpidem.NewTransport(httpidem.TransportConfig{}, logger)
//	client := &http.Client{Transport: t, Timeout: 30 * time.Second}
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
//	invalid key                       400 (see Keys)
//	request body over 10 MiB          413, nothing is claimed
//	store unreachable, or no answer   503, Retry-After; the handler does not run
//	within Config.StoreTimeout (5 s)  (Config.FailOpen runs it without
//	                                  idempotency and logs, unless the client
//	                                  is already gone)
//	unreadable record under the key   500 (ProblemRecordCorrupt); nothing runs
//	repeat of a response over 1 MiB   410 (see below)
//
// Every answer of the middleware itself is an RFC 9457 problem
// (application/problem+json with type, title, status and detail); its type is
// Config.ProblemTypeBase plus a ProblemType, whose documentation says what it
// means and what the client should do.
//
// # Keys
//
// The key is the Idempotency-Key header's value, in one of two forms, both
// accepted everywhere:
//
//   - as sent (Stripe's form): Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324.
//     It must not hold a comma: proxies may merge repeated header lines into
//     one, joined by commas, so "k1, k2" may be two keys.
//   - an RFC 8941 sf-string (the draft's form), when the value starts with
//     a double quote: Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324".
//     The quotes and the escapes \" and \\ are removed; commas are allowed
//     inside the quotes. Parameters are not.
//
// Both forms of one key are the same key. A key is 1 to 255 bytes
// (Config.MaxKeyLength) of printable ASCII, 0x20 to 0x7E, after unquoting.
// A header sent twice, a key out of these bounds, an unquoted key with a
// comma or a malformed quoted string is answered 400 (ProblemKeyInvalid),
// and nothing is claimed.
//
// Keys belong to a scope, Config.Scope(r): the authenticated subject or API
// key of the caller. A scope means here what it means in package
// idempotency, the namespace part of the stored key (one key in two scopes
// is two keys); in HTTP it is derived per request. Scope is required: without it every client would share
// one key space, and a client sending another client's key would get that
// client's stored response, Set-Cookie included. A service that only one
// client calls says so with Config.SingleTenant instead; New refuses a
// Config that sets neither, or both (ErrInvalidConfig).
//
// The stored key is Config.KeyPrefix, a colon, the hex of the first 16
// bytes of SHA-256(scope), a colon and the key:
//
//	httpidem:2bd806c97f0e00af1a1fc3328fa763a9:8e03978e   scope "alice", key "8e03978e"
//
// so no secret used as a scope appears in a key name, and no two (prefix,
// scope, key) triples share a stored key: a KeyPrefix holding a colon is
// an invalid config, since prefix "a:<hash>" would otherwise meet prefix
// "a" with a scope hashing to <hash>. Under SingleTenant the scope is
// empty. LeaseTTL, CompletedTTL, FailedTTL and CacheTTL are at most
// idempotency.MaxTTL (100 years).
//
// # Forwarding the key
//
// A handler that hands its work on (it publishes a message to a broker,
// calls another service) must hand on the key too, so that the next hop
// runs the work once. It reads the key from its request's context, never
// from the header: RequestKey is the parsed key (a quoted key without its
// quotes), ForwardKey the value to forward, the scope's hash (as in the
// stored key), a colon and the parsed key:
//
//	forward, _ := httpidem.ForwardKey(r.Context())
//	msg.Metadata.Set("requestId", forward) // the Watermill middleware's default key field
//
// The raw header would break both promises a forwarded key needs: a key
// sent quoted once and bare once is one key here but two at the consumer,
// which then runs its effect twice; and two tenants sending the same key
// would meet at the consumer. Forwarding matters most when the handler
// runs again for one key: after a 5xx (a publish whose confirm was lost),
// a panic or a lost lease, the client's retry runs it again and it
// publishes again.
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
//   - 2xx, 3xx and 4xx: the key is COMPLETED with the status, the headers
//     the handler set and the body, in a compact binary encoding. 4xx
//     answers are outcomes too (Stripe replays them): fix the request and use
//     a new key. Put rate limiting (429) outside this middleware, so it is
//     never stored.
//   - 5xx: the key is FAILED: a retry with the same request runs the
//     handler again.
//   - panic: the key is FAILED, then the panic goes on unchanged to the
//     outer recovery middleware or to net/http, exactly as without this
//     middleware. It is not turned into a 500 here: the outer layer decides
//     how a panic is answered and logged.
//   - lost lease: the key is FAILED, whatever the handler answered (see
//     below): another request may have claimed the key meanwhile.
//
// A client that leaves changes nothing: a handler that returns normally
// after its client left (its context ended with context.Canceled) is
// COMPLETED with what it wrote, an empty 200 when it wrote nothing, as
// net/http would have answered. Its effect may well have happened, and the
// client's retry, the reason keys exist, must then get the replay rather
// than run the effect a second time. Once the connection breaks, the
// handler's writes still succeed: they are recorded, not sent, so the
// stored response is what the handler wrote, not what the connection took.
// A handler that stops early because its context ended should answer 5xx
// (503, say) to leave the key FAILED for the retry; after its status is
// written, it should panic with http.ErrAbortHandler, which fails the key
// too. Returning normally stores what it wrote as the whole response.
//
// # What is stored and replayed
//
// A replay repeats the first response's status, the headers the handler set
// (all their values, in order) and its body, byte for byte, and adds
// Idempotent-Replayed: true. Not stored, and so not replayed:
//
//   - headers set by outer middleware before the handler ran (a request id,
//     say): a replay keeps the ones set for the repeat;
//   - hop-by-hop headers (Connection, Keep-Alive, Proxy-Connection,
//     Transfer-Encoding, Upgrade, TE, Trailer) and trailers, which describe
//     one connection or one response's framing; net/http sets Date and
//     Content-Length afresh.
//
// When the handler sets no Content-Type, the middleware sets the one net/http
// would sniff, so the replay carries the same one. Informational answers
// (103 Early Hints) go to the first client only. A handler cannot hijack the
// connection under this middleware.
//
// A response body larger than Config.MaxResponseBody (1 MiB) reaches the
// first client in full, and the key is completed without it. Repeats are
// answered 410 Gone (ProblemResponseNotStored, with the original status):
// the effect happened, but the response cannot be replayed. Not 409, which
// clients retry, nor 422, which means a misused key; and never a partial
// 2xx that would look like a replay.
//
// # Expiry
//
// Records expire in the store, on its own clock:
//
//   - a COMPLETED key is replayed for Config.CompletedTTL (24 h) after it
//     completed; after that the key is unknown and a request with it runs
//     again;
//   - a FAILED key is kept for Config.FailedTTL (24 h) after it failed,
//     with its fingerprint (a different request with the key is 422 meanwhile)
//     and its attempt count;
//   - a lapsed lease (the server died mid-handler, or could not renew) is a
//     failed attempt: after Config.LeaseTTL (40 s) without renewal, a retry
//     runs the handler again, and the record is kept for FailedTTL after
//     the lease's end.
//
// # The lease
//
// If the lease is lost while the handler runs, the handler's context is
// cancelled with a cause matching idempotency.ErrLeaseLost
// (context.Cause(r.Context())): when the store reports it (the key was
// deleted, or taken over), and, while renewals keep failing, at nine tenths
// of the lease counted from the start of the last claim or renewal that
// succeeded. The store counts the lease from when that call reached it, so
// the handler is told before another request can claim the key. Handlers
// should pass their context to the effect, so that it stops.
//
// Every store call is bounded by Config.StoreTimeout: the claim, each
// renewal and each attempt to record the outcome; once the key is claimed,
// each call is also bounded by what is left of the lease. A claim that fails
// without an answer may still have been applied: it is released with its
// token before the 503 goes out (so the 503 may take up to twice
// StoreTimeout), and the client's retry finds the key free. Recording runs whether or not the client
// is still there. If recording COMPLETED fails after the handler succeeded,
// it is retried with backoff until the lease runs out (giving up early would
// let a retry run the effect again once the lease expires), and the outcome
// is complete_failed. Should recording take longer than 100 ms, the response
// is flushed to the client meanwhile, so the client has the whole body and
// only the end of the response waits. A failure to record FAILED is logged
// and not retried: the lease lapsing has the same effect.
//
// # Observing
//
// Config.Observer gets one idempotency.Outcome per request the middleware
// applies to (a request that passes through, or is refused 413 or 400 for
// its body before a key is claimed, is not counted), labelled with the
// route's ServeMux pattern (http.Request.Pattern) or "http", never the
// scope:
//
//	processed          the handler ran; the key is COMPLETED
//	duplicate          a replay, or 410 for a response that was not stored
//	in_progress        409
//	key_reused         422
//	missing_key        400 for a missing or invalid key
//	store_unavailable  503
//	caller_gone        the client left before the store answered the claim
//	fail_open          the handler ran without idempotency (FailOpen)
//	handler_failed     5xx, panic or lost lease; the key is FAILED
//	complete_failed    the handler succeeded, COMPLETED was not written
//	lease_lost         the handler succeeded, the store gave the key away
//	corrupt_record     500: the record or its stored response is unreadable
//
// The outcomes that need an operator (store_unavailable, fail_open,
// complete_failed, lease_lost, corrupt_record) are logged at Error with the
// stored key.
//
// An Observer that implements idempotency.ContextObserver gets each outcome
// with the request's context, where otelhttp.NewHandler keeps the server
// span, the stored key (which holds the scope's hash, never the scope), the
// attempt and whether the response was replayed; idemotel's Observer puts
// them on that span.
//
// # The client side
//
// Transport makes a caller's retries safe and automatic. A POST or PATCH
// (TransportConfig.Methods) without an Idempotency-Key gets one, a fresh
// UUID, or the key that WithKey put in its context; a request that has one
// keeps it. Every attempt of the call sends that key, so a server running
// this middleware runs the effect once and answers the other attempts with
// the stored response (Idempotent-Replayed: true). The key a call used is
// on the request of its response, resp.Request.Header.Get("Idempotency-Key").
// A call that got no response returns a *CallError naming the key, but
// under http.Client.Timeout net/http may return its own timeout error in
// its place, without the key. So a caller that retries a call itself (after
// an error, or later from a queue) chooses the key first and retries with
// the same context:
//
//	ctx = httpidem.WithKey(ctx, watermill.NewUUID())
//	resp, err := client.Do(req.WithContext(ctx)) // on error: retry with ctx
//
// An attempt is retried when its failure may be transient:
//
//	no response: a network error, or       the connection failed, or broke after
//	the answer was lost                    the request was sent (the server may
//	                                       have run it: the key makes it safe)
//	409 with Retry-After                   the first request with the key still runs
//	429                                    rate limited
//	500, 502, 503, 504, every other 5xx    the server failed (a handler's 5xx leaves
//	but 501 and 505                        the key FAILED here: the retry runs again)
//
// The pause before a retry is the response's Retry-After, in seconds or as
// an HTTP-date (a date in the past means at once); without one, or when it
// is unreadable or negative, it is exponential backoff with jitter:
// BackoffBase·2^(n−1) before retry n, capped at BackoffMax, each pause a
// random point in the upper half of its step (defaults 200 ms and 10 s:
// 100–200 ms, 200–400 ms, 400–800 ms, ...). A call makes at most
// MaxAttempts attempts (5), and ends as soon as its context does, during a
// pause too, with the context's cause (http.Client.Timeout is such a
// deadline). This middleware answers 409 with
// Retry-After: 1, so with the defaults a call waits about four seconds for
// a first request that still runs, then gets the 409: raise MaxAttempts
// for handlers that take longer.
//
// Never retried, the answer goes to the caller as it is:
//
//   - 2xx and 3xx, and every 4xx but 409 with Retry-After and 429: 400, 422
//     and the others are final (fix the request, and use a new key);
//   - a replay (Idempotent-Replayed: true), whatever its status: it is the
//     answer stored for the key, which every retry would get again (a
//     handler's own 409 or 429 is stored and replayed like any 4xx);
//   - a request that carries no key and whose method is not idempotent
//     (RFC 9110: GET, HEAD, OPTIONS, TRACE, PUT and DELETE are): a custom
//     method, or POST when Methods leaves it out;
//   - a request whose body cannot be rewound: a body without GetBody
//     (http.NewRequest sets GetBody for *bytes.Buffer, *bytes.Reader and
//     *strings.Reader) is sent once, and so is a call whose GetBody fails;
//   - a Retry-After longer than MaxRetryAfter (30 s), and a pause that
//     would end after the context's deadline: the last response is
//     returned at once rather than waited for, or retried early;
//   - errors that no retry cures: the context ended, a certificate was
//     refused, an https URL reached a server that does not speak TLS
//     (tls.RecordHeaderError), the request was refused before it reached the network
//     (an unsupported scheme, an invalid header). The Transport tells the
//     last from a network failure by whether the base asked for a
//     connection (net/http/httptrace's GetConn); a base not built on
//     http.Transport never does, and then only network errors are retried
//     (a net.Error, a syscall error, io.EOF, io.ErrUnexpectedEOF).
//
// A retried response is closed unread. A response whose headers arrived
// and whose body was then cut is returned (reading its body fails): retry
// the call with WithKey(ctx, resp.Request.Header.Get("Idempotency-Key")) to
// get the replay. TransportConfig.OnAttempt sees every attempt: its key,
// status or error, whether it was a replay, and what the Transport does
// next (a Verdict, a label for metrics); retries are logged at Debug.
//
// Redirects are http.Client's: each hop of a 307 or 308, which resend the
// body through GetBody, reaches the Transport as a request of its own, is
// retried on its own, and gets a key of its own, unless the caller gave
// one: WithKey's, or a key header, which http.Client copies to the next
// hop. The key on a response's request is the last hop's. A route that
// answers with a redirect should not run this middleware: it would store
// the redirect under the key, and then answer 422 when the caller's key
// (or, on a retry with WithKey, the last hop's) reaches the target with
// it.
//
// Why not github.com/hashicorp/go-retryablehttp (v0.7.8): its backoff and
// CheckRetry hook would cover part of this, but not as an http.RoundTripper
// that wraps another. Its RoundTripper reads the whole request body into
// memory (FromRequest) instead of using GetBody, so a body that cannot be
// rewound is buffered and retried rather than sent once, and it sets
// Body on the caller's request, which a RoundTripper must not change. It
// sends each attempt through an inner http.Client (redirects, connection
// pool and all), not through the RoundTripper given. CheckRetry does not
// see the request, so "no key and not idempotent: never retry" would need
// the request smuggled through its context; its backoff honours
// Retry-After for 429 and 503 only (not 409), with no cap, reading RFC 1123
// dates only, and without jitter; when retries run out it drains the last
// response and returns an error instead. Replacing CheckRetry, Backoff,
// ErrorHandler, the logger, the inner client and the body handling would
// leave only its loop, for two more modules.
//
// # Guarantees
//
// As long as the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time, and,
//     once it returned without a 5xx, never again while the record is kept
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
