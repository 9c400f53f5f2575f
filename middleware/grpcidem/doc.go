// Package grpcidem runs unary gRPC methods once per idempotency key.
// A retry after a timeout, by grpc-go's retry policy or by a balancer,
// gets the first answer back instead of a second effect. It runs on an
// [idempotency.Once] shared by the process, which holds the store, the
// lease, the TTLs, FailOpen, the Observer, the logger and MaxOutputSize.
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
// docs/GUARANTEES.md ("gRPC: idempotent unary calls") has every case.
//
// # What a call gets
//
// Methods outside [Config].Methods pass through, and so do streams.
// [New] refuses a streaming method, and one its registered service lacks.
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
// The interceptor's own answers carry an ErrorInfo of [ErrorDomain].
// Its reason is the outcome's name in upper case, as KEY_REUSED.
//
// # Keys
//
// The key comes from the metadata (idempotency-key) or from the request's
// string field request_id (AIP-155). It is printable ASCII, not empty; one
// over 200 bytes is stored hashed. A key sent twice, or two that disagree,
// is INVALID_ARGUMENT.
//
// Keys belong to [Config].Scope(ctx), the tenant of the call. Scope is
// required, or SingleTenant. The stored key holds the scope's hash:
//
//	grpcidem:2bd806c97f0e00af1a1fc3328fa763a9:8e03978e   scope "alice", key "8e03978e"
//
// The fingerprint hashes the full method name and the request's
// deterministic wire bytes. One key used for two methods is a reused key.
// A handler forwards [ForwardKey] with its work, never the key as sent.
//
// # What is stored and replayed
//
// After OK, the response's type name and wire bytes; after another final
// code, the status with its details. A replay rebuilds the response from
// [protoregistry.GlobalTypes]. Header and trailer metadata are not stored.
// An answer over MaxOutputSize reaches the first caller; repeats get
// ALREADY_EXISTS. A lost lease cancels the handler's context with
// [idempotency.ErrLeaseLost]. A caller that leaves changes nothing.
//
// # The client interceptor
//
// [Client.UnaryClientInterceptor] gives each call without a key a fresh
// UUID in the metadata. grpc-go's retry policy resends the call below the
// interceptors, so every attempt carries one key. A call keeps the key of
// [WithKey], of its own metadata, or of its request_id.
//
// # Guarantees
//
// While the store is reachable and keeps its records:
//
//   - For one scope and key, the handler runs at most once at a time.
//   - Once it returned a final code, it never runs again while the record lives.
//   - A caller never gets a response its own call did not produce, but a replay.
//   - With the store down, nothing runs unless FailOpen is set.
//
// After a crash mid-handler, the lease lapses and a retry runs it again.
package grpcidem
