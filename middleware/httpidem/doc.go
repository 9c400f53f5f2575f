// Package httpidem runs each POST and PATCH handler once per Idempotency-Key.
// It follows the IETF draft "The Idempotency-Key HTTP Header Field" and
// Stripe's behaviour. It runs on the owner protocol of package idempotency,
// an [idempotency.Once], so servers sharing one [idempotency.Store] act as one.
// The Once holds the store, the lease, the TTLs, FailOpen, the Observer, the
// logger and MaxOutputSize; build one per process and share it.
//
//	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
//	idem, err := httpidem.New(once, &httpidem.Config{Scope: apiKeyID})
//	mux.Handle("POST /payments", idem.Handler(payments))
//
// On the caller's side, [Transport] sends each call with one key and retries it:
//
//	client := &http.Client{Transport: &httpidem.Transport{}, Timeout: 30 * time.Second}
//
// # What a request gets
//
// Methods outside [Config].Methods pass through. For the others:
//
//	first request with a key         the handler runs; its response is stored
//	repeat after it completed        the stored response, byte for byte,
//	                                 plus Idempotent-Replayed: true
//	repeat while it still runs       409, Retry-After
//	same key, different request      422 (method, path, query or body differ)
//	no key, or an invalid one        400 (no key passes with KeyOptional)
//	request body over MaxRequestBody 413; nothing is claimed
//	store down, or slower than       503, Retry-After; the handler does not
//	StoreTimeout                     run (FailOpen runs it, and logs)
//	key failed MaxAttempts times     422; nothing runs
//	unreadable record under the key  500; nothing runs
//	repeat of a response not stored  410, with the first status
//
// The middleware's own answers are RFC 9457 problems (application/problem+json).
// Their type is [Config].ProblemTypeBase and the outcome's name, as key_reused.
// docs/GUARANTEES.md lists each one and what the client should do.
//
// # Keys
//
// The key is the header's value: as sent (Stripe's form), or an RFC 8941
// quoted string (the draft's form, "k1"). Both forms of one key are one key.
// A key is printable ASCII, not empty; one over 200 bytes is stored hashed.
// An unquoted key holds no comma: proxies join repeated headers with commas.
// A bad key is answered 400.
//
// Keys belong to a scope, [Config].Scope(r): the tenant that sent the request.
// Scope is required: without it, one client could fetch another's response.
// A service that one client calls sets [Config].SingleTenant instead.
// The stored key is KeyPrefix, the scope's hash and the key:
//
//	httpidem:2bd806c97f0e00af1a1fc3328fa763a9:8e03978e   scope "alice", key "8e03978e"
//
// So no scope appears in a key name, and no two tenants share a key.
//
// The request's fingerprint hashes its method, path, query and body.
// A repeat with another fingerprint gets 422, never the stored response.
// To hash the body, the middleware reads it in full and hands on a copy.
//
// # Forwarding the key
//
// A handler that hands its work on must hand on the key, so the next hop
// runs it once. It takes the key from its context, never from the header:
//
//	forward, _ := httpidem.ForwardKey(r.Context())
//	msg.Metadata.Set("requestId", forward) // the Watermill middleware's key field
//
// [ForwardKey] is the scope's hash and the key, unquoted. [RequestKey] is the
// key alone. The raw header would let two tenants, or two spellings of one
// key, meet at the consumer.
//
// # Outcomes
//
// The first request claims the key and runs the handler under a lease,
// renewed every third of it. Its response goes to the client as written,
// and is recorded on the side:
//
//   - 2xx, 3xx and 4xx complete the key. Stripe replays 4xx too.
//     Put rate limiting (429) outside this middleware.
//   - 5xx fails the key: a retry runs the handler again.
//   - A panic fails the key, then goes on unchanged to the outer recovery.
//   - A lost lease fails the key, whatever the handler answered.
//
// A client that leaves changes nothing: the handler's answer still completes
// the key, so the client's retry gets the replay. Writes after the
// connection broke are recorded, not sent. A handler that stops because its
// context ended should answer 5xx, or panic with [http.ErrAbortHandler].
//
// A replay repeats the status, the headers the handler set and the body.
// Headers set by outer middleware, hop-by-hop headers and trailers are not
// stored. A response over the Once's MaxOutputSize reaches the first client;
// repeats get 410. A handler cannot hijack the connection here.
//
// # The lease and the store
//
// Every store call is bounded by the Once's StoreTimeout and by what is left
// of the lease. When the lease is lost, the handler's context is cancelled
// with [idempotency.ErrLeaseLost] as its cause, before another request can
// claim the key. A claim that got no answer is released before the 503.
// Recording COMPLETED is retried until the lease runs out. After 100 ms the
// response is flushed meanwhile. Records expire in the store, on its clock.
//
// # Observing
//
// The Once's [idempotency.Observer] gets one outcome per request with a key,
// with the request's context, where otelhttp keeps the server span.
// Its label is the route's ServeMux pattern, or "http"; never the scope.
// A refused body (413) is not counted. Outcomes that need an operator are
// logged at Error with the stored key.
//
// # The client side
//
// [Transport] gives each POST and PATCH without a key a fresh UUID, or the
// key of [WithKey]. Every attempt sends it, so the server runs the effect once.
// The key a call used is on resp.Request. A call that got no response returns
// a [*CallError] naming it, but under [http.Client].Timeout net/http may not.
// So a caller that retries a call itself chooses the key first:
//
//	ctx = httpidem.WithKey(ctx, watermill.NewUUID())
//	resp, err := client.Do(req.WithContext(ctx)) // on error: retry with ctx
//
// Retried, with the same key: no response (the network failed, or the answer
// was lost); 409 with Retry-After; 429; every 5xx but 501 and 505. The pause
// is the Retry-After, else exponential backoff with jitter. At most
// MaxAttempts attempts, and never past the context's deadline.
//
// Final: 2xx, 3xx and other 4xx; a replay, whatever its status; a request
// without a key whose method is not idempotent; a body without GetBody;
// a Retry-After over MaxWait; a refused certificate. docs/GUARANTEES.md
// has the rules in full, and why go-retryablehttp does not fit.
//
// # Guarantees
//
// While the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time.
//     Once it answered below 500, it never runs again while the record lives.
//   - A repeat gets the first response, 409 while it runs, or 422.
//     A client never gets a 2xx its own request did not produce, but a replay.
//   - With the store down, nothing runs unless FailOpen is set.
//
// Not guaranteed: after a crash mid-handler, the lease lapses and a retry
// runs the handler again. Effects outside the store are exactly-once only
// when they are idempotent or transactional themselves.
package httpidem
