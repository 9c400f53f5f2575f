// Package grpcidem runs unary gRPC methods once per idempotency key.
// A client's retry after a timeout, grpc-go's retry policy, or a replaying
// load balancer gets the first answer back instead of a second effect.
// It runs on the owner protocol of package idempotency, an [idempotency.Once],
// so servers sharing one [idempotency.Store] act as one. The Once holds the
// store, the lease, the TTLs, FailOpen, the Observer, the logger and
// MaxOutputSize; build one per process and share it.
//
//	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
//	idem, err := grpcidem.New(once, &grpcidem.Config{
//		Methods: []string{"/payments.v1.Payments/CreatePayment"},
//		Scope:   func(ctx context.Context) string { return subjectOf(ctx) },
//	})
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.UnaryServerInterceptor))
//
// On the caller's side, [Client] gives each logical call one key:
//
//	client := &grpcidem.Client{}
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor), ...)
//
// # What a call gets
//
// Methods outside [Config].Methods pass through, and so do streams: an
// effect spread over many messages has no one answer to replay. [New]
// refuses a streaming method, and one its registered service does not have.
// For the methods listed:
//
//	first call with a key                 the handler runs; its answer is stored
//	repeat after it completed             the stored response or final status,
//	                                      with header idempotent-replayed: true
//	repeat while the first call runs      ABORTED, with RetryInfo
//	same key, different request           FAILED_PRECONDITION
//	store down, or slower than            UNAVAILABLE, with RetryInfo; the
//	StoreTimeout                          handler does not run (unless FailOpen)
//	handler returns UNAVAILABLE,          the key FAILED: a retry runs the
//	INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, handler again
//	RESOURCE_EXHAUSTED, ABORTED, CANCELED,
//	or panics, or loses its lease
//	handler returns OK or another code    COMPLETED, and replayed
//	no key, or an invalid one             INVALID_ARGUMENT (unless KeyOptional)
//	key failed MaxAttempts times          FAILED_PRECONDITION; nothing runs
//	unreadable record under the key       INTERNAL; nothing runs
//	repeat of an answer not stored        ALREADY_EXISTS
//
// The interceptor's own answers carry a google.rpc.ErrorInfo of [ErrorDomain].
// Its reason is the outcome's name in upper case, as KEY_REUSED.
// docs/GUARANTEES.md lists each one, in one table with the HTTP problems.
//
// A reused key is FAILED_PRECONDITION: the request is valid, but conflicts
// with what the server recorded. No retry policy resends it. CANCELED is
// retryable: a handler returns it when its caller left, which says nothing
// of the request.
//
// # Keys
//
// The key comes from the metadata (idempotency-key) or from a string field
// of the request (request_id, as AIP-155 names it), read by protoreflect.
// A key is printable ASCII, not empty; one over 200 bytes is stored hashed.
// A key sent twice, or two sources that disagree, is answered
// INVALID_ARGUMENT; nothing is claimed.
//
// Keys belong to a scope, [Config].Scope(ctx): the tenant of the call. Scope
// is required, as in package httpidem; [Config].SingleTenant opts out.
// The stored key is KeyPrefix, the scope's hash and the key:
//
//	grpcidem:2bd806c97f0e00af1a1fc3328fa763a9:8e03978e   scope "alice", key "8e03978e"
//
// The fingerprint hashes the full method name and the request's
// deterministic wire bytes. A repeat with another one is FAILED_PRECONDITION.
// Keys are not per method: one key used for two methods is a reused key.
//
// # Forwarding the key
//
// A handler that hands its work on forwards [ForwardKey], the scope's hash
// and the key, never the key as sent:
//
//	forward, _ := grpcidem.ForwardKey(ctx)
//	msg.Metadata.Set("requestId", forward) // the Watermill middleware's key field
//
// # What is stored and replayed
//
// After OK: the response's full type name and its deterministic wire bytes.
// After another final code: the status, with its message and details.
// A replay rebuilds the response from [protoregistry.GlobalTypes], checked
// against the method's output type. Header and trailer metadata are not
// stored. An answer over the Once's MaxOutputSize reaches the first caller;
// repeats get ALREADY_EXISTS with the original code.
//
// # The lease and the store
//
// The first call claims the key and runs the handler under a lease, renewed
// every third of it. When the lease is lost, the handler's context is
// cancelled with [idempotency.ErrLeaseLost] as its cause. The answer is
// recorded before grpc-go sends it; recording COMPLETED is retried until the
// lease runs out. A panic fails the key, then goes on to the outer recovery.
// A handler that answers after its caller left completes the key: the
// caller's retry gets the replay. Records expire in the store, on its clock.
//
// # The client interceptor
//
// [Client.UnaryClientInterceptor] gives each call without a key a fresh UUID
// in the metadata. A call keeps the key of [WithKey], of its own metadata,
// or of its request's field. grpc-go's retry policy resends a call below the
// interceptors, with the same metadata: every attempt carries one key.
// A service config whose retryPolicy lists UNAVAILABLE (and ABORTED, to wait
// out a call still running) makes such retries automatic.
//
// # Observing
//
// The Once's [idempotency.Observer] gets one outcome per call with a key,
// labelled with the full method name, never the scope. A caller whose
// deadline passed during the claim is caller_gone. Outcomes that need an
// operator are logged at Error with the stored key.
//
// # Guarantees
//
// While the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time.
//     Once it returned a final code, it never runs again while the record lives.
//   - A repeat gets the first answer, ABORTED while it runs, or
//     FAILED_PRECONDITION. A caller never gets a response its own call did
//     not produce, but a replay.
//   - With the store down, nothing runs unless FailOpen is set.
//
// Not guaranteed: after a crash mid-handler, the lease lapses and a retry
// runs the handler again. Effects outside the store are exactly-once only
// when they are idempotent or transactional themselves.
package grpcidem
