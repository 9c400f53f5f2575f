// Package grpcidem makes unary gRPC methods idempotent per key: a client
// that retries after a timeout, grpc-go's retry policy resending a call, or
// a load balancer replaying one, gets the first answer back instead of a
// second effect. It keeps its state in the same idempotency.Store as the
// Watermill middleware and package httpidem (Redis in production, memstore
// for tests and demos), and runs on the same owner protocol
// (idempotency.Once): any number of server processes sharing that store
// behave as one. As in every adapter of this module (see Names in package
// idempotency), New returns a *Middleware, plugged in by the method named
// after what grpc-go takes: UnaryServerInterceptor, a
// grpc.UnaryServerInterceptor; and NewClient a *Client, plugged in by
// UnaryClientInterceptor.
//
//	idem, err := grpcidem.New(grpcidem.Config{
//		Store:   store,
//		Methods: []string{"/payments.v1.Payments/CreatePayment"},
//		Scope:   func(ctx context.Context) string { return subjectOf(ctx) },
//	}, logger)
//	...
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.UnaryServerInterceptor))
//
// and on the client side, one key per logical call that its retries reuse:
//
//	client, err := grpcidem.NewClient(grpcidem.ClientConfig{})
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor), ...)
//
// # What a call gets
//
// Calls of a method not in Config.Methods pass through untouched, and so do
// streaming calls, always: the interceptor is a grpc.UnaryServerInterceptor,
// which grpc-go never runs for a stream, and the package offers none for
// streams (an effect spread over many messages has no one answer to
// replay). So that no listed method is silently left unprotected, New
// looks every method of Config.Methods up in the protobuf registry
// (protoregistry.GlobalFiles, where generated code registers its
// services, as grpc.ServiceDesc's Metadata names their files) and refuses,
// with ErrInvalidConfig, a streaming method and a method that its
// registered service does not have (a misspelt name); a method of a
// service the registry does not know (served without generated code) is
// taken as written. For the methods listed:
//
//	case                                      answer
//	first call with a key                     the handler runs; its answer is stored
//	repeat after it completed                 the stored response, or the stored
//	                                          final status with its details, and the
//	                                          header metadata idempotent-replayed: true
//	a retry while the first call runs         ABORTED, with RetryInfo (and the trailer
//	                                          grpc-retry-pushback-ms)
//	same key, different request               FAILED_PRECONDITION (another method, or
//	                                          another request message)
//	store down, or no answer within           UNAVAILABLE, with RetryInfo: fail closed,
//	Config.StoreTimeout (5 s)                 the handler does not run (Config.FailOpen
//	                                          runs it without idempotency, and logs)
//	handler returns UNAVAILABLE, INTERNAL,    key FAILED: the answer goes to the caller,
//	UNKNOWN, DEADLINE_EXCEEDED,               and a retry runs the handler again
//	RESOURCE_EXHAUSTED, ABORTED or CANCELED,
//	or panics, or its lease is lost
//	handler returns any other code, or OK     COMPLETED, and replayed with the same
//	                                          response, or status and details
//	no key                                    INVALID_ARGUMENT (unless Config.KeyOptional)
//	invalid key                               INVALID_ARGUMENT (see Keys)
//	unreadable record under the key           INTERNAL; nothing runs
//	repeat of an answer over MaxResponseSize  ALREADY_EXISTS (see below)
//
// Every answer of the interceptor itself carries a google.rpc.ErrorInfo
// detail with Domain ErrorDomain and one of the Reason constants, whose
// documentation says what it means and what the client should do; a client
// tells them from the handler's own statuses by it.
//
// Why FAILED_PRECONDITION for a reused key: the request is not invalid in
// itself (INVALID_ARGUMENT says it never can succeed); it conflicts with
// what the server already recorded for the key, a state of the system that
// the client must not retry against — the meaning gRPC gives to
// FAILED_PRECONDITION. Neither code is retried by any retry policy that
// follows gRPC's guidance, and the key's first answer stays stored.
//
// CANCELED joins the retryable codes of the table beside the others: it is
// what a handler returns when its caller went away, which says nothing
// about the request, and replaying it to the caller's retry would refuse the
// retry for good.
//
// # Keys
//
// The key comes from the request metadata (Config.Metadata, default
// idempotency-key) or from a string field of the request message
// (Config.RequestField, default request_id, as Google's AIP-155 names it),
// read through protoreflect, so that no generated code needs to know of this
// package. A message without such a field, or that leaves it empty, needs
// the metadata. A metadata key sent twice, two sources that disagree, an
// empty metadata value, or a key longer than Config.MaxKeyLength (255 bytes)
// or holding a byte outside printable ASCII (0x20 to 0x7E) is answered
// INVALID_ARGUMENT (ReasonKeyInvalid), and nothing is claimed.
//
// Keys belong to a scope, Config.Scope(ctx): the authenticated peer or
// subject of the call. A scope means here what it means in package
// idempotency, the namespace part of the stored key (one key in two scopes
// is two keys); in gRPC it is derived per call. Scope is required, exactly
// as in package httpidem:
// without it every client would share one key space, and a client sending
// another client's key would get that client's stored answer. A service that
// only one client calls says so with Config.SingleTenant instead. The stored
// key is Config.KeyPrefix, a colon, the hex of the first 16 bytes of
// SHA-256(scope), a colon and the key:
//
//	grpcidem:2bd806c97f0e00af1a1fc3328fa763a9:8e03978e   scope "alice", key "8e03978e"
//
// A KeyPrefix holding a colon is an invalid config, so that no prefix,
// scope and key share a stored key with another; LeaseTTL, CompletedTTL,
// FailedTTL and CacheTTL are at most idempotency.MaxTTL (100 years).
//
// A call's fingerprint is SHA-256 over its full method name and its request
// message's deterministic wire encoding (proto.MarshalOptions{Deterministic:
// true}, which sorts map entries). It is stored with the key; a repeat whose
// fingerprint differs is answered FAILED_PRECONDITION (ReasonKeyReused) and
// never sees the stored answer. Keys are not per method: one key used for
// two methods is a reused key.
//
// # Forwarding the key
//
// A handler that hands its work on (it publishes a message to a broker,
// calls another service) must hand on the key too, so that the next hop
// runs the work once. It forwards ForwardKey, the scope's hash (as in the
// stored key), a colon and the key, never the key as the call sent it:
//
//	forward, _ := grpcidem.ForwardKey(ctx)
//	msg.Metadata.Set("requestId", forward) // the Watermill middleware's default key field
//
// Two tenants that send the same key would otherwise meet at the consumer.
// Forwarding matters most when the handler runs again for one key: after a
// retryable code (a publish whose confirm was lost), a panic or a lost
// lease, the caller's retry runs it again and it publishes again.
//
// # What is stored and replayed
//
// After an OK, the response's message full name and its deterministic wire
// bytes; after any other code that is not retryable, the final status:
// code, message and details (a google.rpc.Status). A replay rebuilds the
// message from the protobuf type registry (protoregistry.GlobalTypes, where
// generated code registers itself), checked against the method's output type
// when the registry knows the method, or returns the status as it was, and
// sets the header metadata idempotent-replayed: true. Header and trailer
// metadata that the handler set are not stored, and a replay does not carry
// them.
//
// An answer over Config.MaxResponseSize (1 MiB; for a response, its wire
// bytes and type name) reaches the first caller in full, and the key is
// completed without it. Repeats are answered ALREADY_EXISTS
// (ReasonResponseNotStored, with the original code and size in the
// ErrorInfo's metadata): the call already ran and its effect happened, so a
// client must not retry it with a new key, and the code is not one that
// retry policies resend; but the answer cannot be replayed.
//
// # The lease and the store
//
// The first call claims the key (IN_PROGRESS, with a 40 s lease renewed
// every lease/3 while the handler runs) and runs the handler under the
// lease's context, which is cancelled with idempotency.ErrLeaseLost as its
// cause when the lease is lost. The answer is recorded before grpc-go
// sends it. Recording COMPLETED is retried with backoff until the lease runs
// out when the store fails (the response waits meanwhile): giving up early
// would let a retry run the effect again. A panic fails the key, then goes
// on unchanged to the outer recovery interceptor (or crashes the server, as
// grpc-go does without one).
//
// A caller that leaves changes nothing: a handler that returns an answer
// after its caller cancelled is COMPLETED with it, so the caller's retry
// gets the replay; one that returns CANCELED or DEADLINE_EXCEEDED because
// its context ended leaves the key FAILED for the retry.
//
// Records expire in the store, on its own clock: a COMPLETED key is
// replayed for Config.CompletedTTL (24 h), a FAILED key keeps its
// fingerprint and attempts for Config.FailedTTL (24 h), and a lapsed lease
// (the server died mid-handler) counts as a failed attempt.
//
// # The client interceptor
//
// Client.UnaryClientInterceptor gives each logical call a fresh key (a random UUID) in the
// metadata, unless the call already carries one (WithKey, or the request's
// request_id). A key set with WithKey travels in the context and is
// written by the Client under its own ClientConfig.Metadata, so that an
// application's key always reaches the server under the name the Client
// and the server were configured with; a connection without a Client's
// interceptor sends it under defaultMetadata. grpc-go resends a call for its retry policy below the
// interceptors, with the same metadata, so all attempts of one call carry
// one key: a response lost on the way back (the connection drops after the
// server answered) is retried as UNAVAILABLE and answered with the replay.
// A service config whose retryPolicy lists UNAVAILABLE (and ABORTED, to
// wait out a call still running elsewhere) makes such retries automatic.
//
// # Observing
//
// Config.Observer gets one idempotency.Outcome per call the interceptor
// applies to, labelled with the full method name, never the scope: the
// same outcomes as package httpidem's (processed, duplicate, in_progress,
// key_reused, missing_key, store_unavailable, caller_gone, fail_open,
// handler_failed, complete_failed, lease_lost, corrupt_record). A caller
// whose deadline passed before the store answered the claim is caller_gone,
// not store_unavailable. The outcomes that need an operator are logged at
// Error with the stored key.
//
// # Guarantees
//
// As long as the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time, and,
//     once it returned a code that is not retryable, never again while the
//     record is kept (Config.CompletedTTL).
//   - A repeat gets the first answer, ABORTED while it runs, or
//     FAILED_PRECONDITION if it is a different call. A caller never gets a
//     response that its own call's handler did not produce, other than a
//     replay of the answer stored for its own scope, key and fingerprint.
//   - With the store down, nothing runs unless FailOpen is set.
//
// Not guaranteed: a server that crashes mid-handler stops renewing, and
// after the lease a retry runs the handler again. Effects outside the store
// are exactly-once only when that effect is itself idempotent or
// transactional. This interceptor removes the duplicates that retries
// cause; it cannot undo a crash halfway through an effect.
package grpcidem
