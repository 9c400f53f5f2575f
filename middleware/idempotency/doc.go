// Package idempotency gives each message, request or job one effect. A
// [Store] shared by every consumer keeps a small state machine per key.
// [Once] is the owner's side of it, written once for every adapter.
//
//	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Logger: logger})
//	idem, err := idempotency.New(once, nil)
//	router.AddMiddleware(idem.Middleware)
//
// Build one [Once] per process and share it. Package httpidem (net/http)
// and package grpcidem (gRPC) run on it too. It holds the one cache of
// completed keys. [OnceConfig] holds every setting the adapters share. Each
// adapter's Config holds only what is its own: [Config] here.
//
// # State machine
//
// A key is ABSENT, IN_PROGRESS, COMPLETED or FAILED (see [Store]). A claim
// is one atomic store operation: of any number of consumers, one runs the
// handler. The owner holds a lease, 40 s by default. It renews it every
// third of the lease while the handler runs. Complete, Fail and renewal
// are fenced by the owner's token. Expiry is the store's own, on its clock.
//
// A lease that lapses is a failed attempt: its owner died. The record stays
// FAILED for FailedTTL with its count. A message that kills every consumer
// reaches [OnceConfig.MaxAttempts] and the poison queue.
//
// # Keys
//
// The key is the metadata "requestId", then "Idempotency-Key", else the
// message UUID; [Config.KeyFunc] replaces that. It is stored as
// prefix:scope:key. The prefix is [Config.KeyPrefix], "idem". The scope is
// the handler's name, so two handlers of one topic each run a message once.
// Colons and percent signs in the scope are escaped. A prefix with a colon
// is an invalid config. So no two (prefix, scope, key) share a stored key.
//
// A key longer than 200 bytes is stored as "sha256:" and its hex SHA-256.
// So is a key that starts with "sha256:". Every adapter does the same: none
// refuses a key for its length. Keys may hold any bytes.
//
// A handler must not copy its input's requestId onto what it produces. Give
// each produced message its own, or none: its UUID is then its key.
//
// # Outcomes
//
// What the middleware returns to the router for each delivery:
//
//	claim result            middleware does                               router then
//	acquired, success       store COMPLETED with the produced messages    publishes them, acks
//	  output too large      store COMPLETED without them (counted)        publishes them, acks
//	acquired, error/panic   store FAILED, return the error                nacks: redelivery (attempts+1)
//	COMPLETED               skip the handler, return the stored messages  republishes them (same UUIDs), acks
//	IN_PROGRESS elsewhere   wait NackDelay, return ErrInProgress          nacks: redelivery later
//	store unavailable       wait NackDelay, return ErrStoreUnavailable    nacks; FailOpen runs the handler
//	no key                  return ErrMissingKey (permanent)              nacks, or poison queue
//	attempts > MaxAttempts  return ErrTooManyAttempts (permanent)         nacks, or poison queue
//	different payload       return ErrKeyReused (permanent, CheckPayload) nacks, or poison queue
//	corrupt record          wait NackDelay, return ErrCorruptRecord       nacks: redelivery later
//
// Each delivery has one [Outcome]. It labels logs and metrics. The HTTP
// problem types and the gRPC reasons derive from the same table.
// [OutcomeOf] names the outcome of an error of [Once.Claim] or
// [Lease.Complete].
//
// Permanent errors never succeed on redelivery. Put Watermill's
// PoisonQueueWithFilter with [IsPermanent] outside this middleware.
//
// # The recommended stack
//
// The first middleware added is the outermost:
//
//	router, err := message.NewRouter(message.RouterConfig{}, idempotency.RouterLogger(logger))
//	router.AddMiddleware(
//		middleware.CorrelationID,
//		poison, // PoisonQueueWithFilter(pub, topic, idempotency.IsPermanent)
//		middleware.Recoverer,
//		idem.Middleware,
//		middleware.Timeout(time.Minute),
//	)
//
// Timeout goes inside: a handler that honours its context then fails, and
// runs again. Retry inside runs its retries under one claim. [RouterLogger]
// logs the router's line for each in-progress copy at Debug.
//
// # Guarantees
//
//   - No message is acked unless its handler succeeded or its key is
//     COMPLETED. A store outage nacks and loses nothing.
//   - A handler runs at most once at a time per key. After a success it
//     never runs again while the record lives (CompletedTTL, 24 h).
//   - A live, slow handler keeps its lease. A crashed one's key is free
//     once its lease lapses.
//   - Produced messages are stored with COMPLETED and replayed for every
//     duplicate, with the same UUIDs: outputs are at least once.
//   - Outputs over [OnceConfig.MaxOutputSize] (1 MiB) are at most once. The
//     run counts as [OutcomeOutputNotStored] and is logged at Error.
//   - If COMPLETED cannot be written, the write is retried within the
//     lease. The message is then acked anyway: [OutcomeCompleteFailed].
//   - A lost lease cancels the handler's context with cause [ErrLeaseLost].
//     That happens before the store can hand the key to another consumer.
//   - Every transition is idempotent for its owner. A claim whose reply was
//     lost is released before the nack.
//   - A value that is not a record is [ErrCorruptRecord]: never a duplicate,
//     never overwritten. An operator deletes the key.
//   - Leases and TTLs are at most [MaxTTL]. A longer one is an invalid
//     config, never "no expiry".
//   - A key this process saw COMPLETED is answered from memory for up to a
//     minute, never past its record. An operator's delete reaches this
//     process when that entry ends. A negative CacheMaxBytes turns the
//     cache off.
//   - Side effects outside the store are exactly once only if they are
//     idempotent or transactional. With package pgstore or mysqlstore the
//     effect and COMPLETED commit in one transaction.
//
// docs/GUARANTEES.md has every case: poison requeues, the cache, failures
// after the handler, and how each guarantee is tested.
//
// # Outside Watermill
//
// [Once.Do] runs a function once per key across every process sharing the
// store. Later callers get its stored value, with [OutcomeDuplicate].
// [Once.Claim] is for adapters that write their result themselves.
//
// # Observability
//
// Every outcome is logged with its key, handler and attempt. An [Observer]
// gets each outcome with its message's context, each store call's latency,
// and each cache lookup. Package idemprom exports them to Prometheus,
// package idemotel to OpenTelemetry.
//
// # Writing a store
//
// A [Store] implements the state machine, one atomic operation per
// transition. It refuses bad arguments with [ErrEmptyKey], [ErrEmptyToken]
// and [ErrInvalidTTL], and holds a TTL longer than [MaxTTL] for MaxTTL. It
// returns [ErrLeaseLost] and [ErrCorruptRecord] wrapped with the key. Renew
// answers [ErrCompletedByOwner] for a key its own token completed. It
// honours its context's deadline. It passes storetest.Run.
// docs/OPERATIONS.md has the rest.
package idempotency
