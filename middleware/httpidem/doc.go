// Package httpidem runs each POST and PATCH handler once per Idempotency-Key.
// It follows the IETF draft "The Idempotency-Key HTTP Header Field" and
// Stripe's behaviour, on an [idempotency.Once] shared by the process.
// The Once holds the store, the lease, the TTLs, FailOpen, the Observer,
// the logger and MaxOutputSize.
//
//	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
//	idem, err := httpidem.New(once, &httpidem.Config{Scope: apiKeyID})
//	mux.Handle("POST /payments", idem.Handler(payments))
//
// On the caller's side, [Transport] sends each call with one key and retries it:
//
//	client := &http.Client{Transport: &httpidem.Transport{}, Timeout: 30 * time.Second}
//
// docs/GUARANTEES.md ("HTTP: the Idempotency-Key header") has every case.
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
// The middleware's own answers are RFC 9457 problems, typed by outcome name.
//
// # Keys
//
// A key is the header's value, as sent or as an RFC 8941 quoted string.
// It is printable ASCII, not empty; one over 200 bytes is stored hashed.
// An unquoted key holds no comma: proxies join repeated headers with commas.
//
// Keys belong to [Config].Scope(r), the tenant that sent the request.
// Scope is required, or SingleTenant. The stored key holds the scope's hash:
//
//	httpidem:2bd806c97f0e00af1a1fc3328fa763a9:8e03978e   scope "alice", key "8e03978e"
//
// The fingerprint hashes the method, path, query and body.
// A handler forwards [ForwardKey] with its work, never the raw header.
//
// # Outcomes
//
// The handler runs under a lease. Its response goes to the client as written:
//
//   - 2xx, 3xx and 4xx complete the key and are replayed.
//   - 5xx, a panic or a lost lease fail the key: a retry runs it again.
//   - A client that leaves changes nothing: its retry gets the replay.
//
// A replay repeats the status, the handler's headers and the body.
// A response over MaxOutputSize reaches the first client; repeats get 410.
// A lost lease cancels the handler's context with [idempotency.ErrLeaseLost].
//
// # The client side
//
// [Transport] gives each POST and PATCH without a key a fresh UUID, or the
// key of [WithKey], and sends it on every attempt. It retries a lost answer,
// 409 with Retry-After, 429 and 5xx but 501 and 505, within MaxAttempts.
// A call without a response returns a [*CallError] naming its key.
//
// # Guarantees
//
// While the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time.
//   - Once it answered below 500, it never runs again while the record lives.
//   - A client never gets a 2xx its own request did not produce, but a replay.
//   - With the store down, nothing runs unless FailOpen is set.
//
// After a crash mid-handler, the lease lapses and a retry runs it again.
package httpidem
