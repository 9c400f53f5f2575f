// Package idempotency gives Watermill handlers exactly-once effects: a
// router middleware that keeps, per message key, a small state machine in a
// Store shared by every consumer (Redis in production, see package
// redisstore). It lives in middleware/idempotency, beside the stores and the
// HTTP and gRPC adapters, under a name of its own, so that it imports beside
// Watermill's message/router/middleware without an alias:
//
//	import "github.com/idempotency/watermill-idempotency/middleware/idempotency"
//
//	idem, err := idempotency.New(idempotency.Config{Store: store}, logger)
//	router.AddMiddleware(idem.Middleware)
//
// # Names
//
// The adapters of this module share one vocabulary. Each adapter package
// (this one for a Watermill router, httpidem for net/http, grpcidem for
// gRPC) has New(cfg, logger) (*Middleware, error), and its Middleware is
// plugged in by the method named after what its framework takes, so that
// the call site reads as the framework's own:
//
//	router.AddMiddleware(idem.Middleware)                   // a message.HandlerMiddleware
//	mux.Handle("POST /payments", idem.Handler(payments))    // func(http.Handler) http.Handler
//	grpc.ChainUnaryInterceptor(idem.UnaryServerInterceptor) // a grpc.UnaryServerInterceptor
//
// (and grpcidem's Client by UnaryClientInterceptor, a
// grpc.UnaryClientInterceptor). One name for the type keeps the three
// packages' documentation and code alike; the method's name says where it
// goes.
//
// A key belongs to a scope: the namespace in the middle of its stored key
// (prefix:scope:key), so that one key in two scopes is two keys. Each
// Config calls the function that returns it Scope, with that meaning;
// only its default differs. Here it is the handler's name, since two
// handlers of one topic must each run a message once. In httpidem and
// grpcidem it is derived from each request or call (the tenant that sent
// it) and is required unless Config.SingleTenant says that one client
// calls the service: no default is safe there, since one scope shared by
// every client would let a client's key fetch another client's stored
// response.
//
// # State machine
//
// Each key is ABSENT, IN_PROGRESS (one owner holds a lease, 40 s by default,
// renewed every third of it while the handler runs), COMPLETED (24 h) or
// FAILED (24 h). Claiming is one atomic store operation, so exactly one of
// any number of concurrent consumers runs the handler. Complete, Fail and
// renewal are fenced by the owner's token: a consumer whose lease lapsed
// changes nothing. Expiry is the store's own (Redis PEXPIRE), on the store's
// clock.
//
// A lease that lapses (its owner died: OOM, os.Exit, SIGKILL, a lost
// machine) is a failed attempt. The record stays, FAILED, for FailedTTL with
// its attempt count, so a message that kills every consumer that runs it
// reaches MaxAttempts and the poison queue instead of crash-looping its
// partition for ever.
//
// # One owner protocol
//
// The owner's side of the state machine is written once, in Once, and used
// by this middleware, by package httpidem and by any Go code through
// Once.Do: claim; renew the lease with a safety margin, cancelling the
// handler's context (cause ErrLeaseLost) a tenth of a lease before the store
// could hand the key over; complete, retrying within the lease; fail. Every
// store call of the owner is bounded by StoreTimeout and by what is left of
// its lease, so no call outlives the lease — provided the store honours its
// context's deadline (redisstore requires a go-redis client with
// ContextTimeoutEnabled for this reason).
//
// Every transition is idempotent for its owner, because clients resend a
// command whose reply was lost (go-redis does, MaxRetries times): a resent
// claim with the owner's token acquires again instead of refusing its own
// first try, and a resent Complete or Fail that was already applied
// succeeds. A claim whose call failed without an answer (it timed out, or
// the subscriber is closing) may still have been applied: it is released
// with its token (Store.Release) before the message is nacked, so that the
// key neither stalls until the lease lapses nor counts an attempt that never
// ran. A store that answers nothing cannot take the release either: such a
// claim lapses with its lease and counts as an attempt.
//
// A value under a key that is not one of the store's records is
// ErrCorruptRecord: never taken for a duplicate, never overwritten; the
// message is nacked (after NackDelay), logged with its key and counted as
// OutcomeCorruptRecord until an operator deletes the key.
//
// # Keys
//
// The key is the first non-empty metadata field of Config.KeyMetadata
// (default "requestId", then "Idempotency-Key"), else the message UUID, or
// whatever Config.KeyFunc returns. It is stored as prefix:scope:key, where
// the prefix is Config.KeyPrefix ("idem") and the scope defaults to the
// handler's name, so that two handlers consuming one topic each process a
// message once (each on a subscriber of its own consumer group, such as
// backends' Backend.SubscriberForGroup: two handlers on one grouped
// subscriber divide the topic's messages between them). Colons and percent signs in the scope are escaped (%3A,
// %25), and a prefix holding a colon is an invalid config (use "shop.billing",
// not "shop:billing"), so that no prefix, scope and key store under
// another's key: prefix "shop:billing" with scope "charge" and key
// "order-7" would otherwise be prefix "shop" with scope "billing" and key
// "charge:order-7" (a test tries every short prefix, scope and key made of
// separators and the bytes of their escapes). Across adapters it rests on
// their prefixes: httpidem and grpcidem store prefix:hash(scope):key under
// prefixes of their own ("httpidem", "grpcidem"), and Once.Do stores the
// key it is given unchanged, so keep each adapter's prefix, and such keys,
// apart where they share a store. Keys
// longer than Config.MaxKeyLength (200 bytes) are replaced by "sha256:" and
// their hex SHA-256, and so is a key that starts with "sha256:", so that it
// cannot take a long key's place. Keys may hold any bytes. An operator
// looking for a message's record (cmd/idemctl get) builds its key the same
// way: idem:orders:req-1 for requestId req-1 in handler orders.
//
// A handler must not copy its input's requestId onto the messages it
// produces: the next hop would see one key on all of them, run the first and
// ack the others as duplicates. Give each produced message its own
// requestId, or none (its UUID is then its key, and stays stable across
// replays).
//
// # Outcomes
//
// What the middleware returns to the router for each delivery:
//
//	claim result            middleware does                               router then
//	acquired, success       store COMPLETED with the produced messages    publishes them, acks
//	  output too large      store COMPLETED without them (counted)        publishes them, acks
//	acquired, error/panic   store FAILED, return the error               nacks: redelivery (attempts+1)
//	COMPLETED               skip the handler, return the stored messages  republishes them (same UUIDs), acks
//	IN_PROGRESS elsewhere   wait NackDelay, return ErrInProgress          nacks: redelivery later
//	store unavailable       wait NackDelay, return ErrStoreUnavailable    nacks; FailOpen runs the handler
//	no key                  return ErrMissingKey (permanent)              nacks, or poison queue
//	attempts > MaxAttempts  return ErrTooManyAttempts (permanent)         nacks, or poison queue
//	different payload       return ErrKeyReused (permanent, CheckPayload) nacks, or poison queue
//	corrupt record          wait NackDelay, return ErrCorruptRecord       nacks: redelivery later
//
// A different payload under a key whose first run is still in progress is
// answered like any copy of it (ErrInProgress); ErrKeyReused is decided once
// the key is COMPLETED or FAILED.
//
// NackDelay is spent in the middleware before the router nacks; a broker
// backend may wait again before it redelivers (package backends waits
// NackResendSleep, 1 s by default). The two add up.
//
// Permanent errors never succeed on redelivery: add Watermill's
// PoisonQueueWithFilter with IsPermanent before (outside) this middleware.
//
// # The recommended stack
//
// The first middleware added is the outermost:
//
//	router, err := message.NewRouter(message.RouterConfig{}, idempotency.RouterLogger(logger))
//	router.AddMiddleware(
//		middleware.CorrelationID,
//		poison,                          // PoisonQueueWithFilter(pub, topic, idempotency.IsPermanent)
//		middleware.Recoverer,
//		idem.Middleware,
//		middleware.Timeout(time.Minute),
//	)
//
// PoisonQueue must sit outside, or it never sees ErrTooManyAttempts.
// Timeout goes inside: it ends the handler's context after a bound, and a
// handler that honours its context then returns an error, its key is left
// FAILED and the redelivery runs it again. A hung handler that ignores its
// context cannot be stopped by any middleware: it keeps renewing its lease,
// and its copies are nacked as in progress, until it returns. Retry inside runs its retries under one
// claim (one attempt); outside, each retry is a new claim and a new attempt.
// Recoverer may go either side: a panic leaves the key FAILED either way.
//
// # Poison messages
//
// A message refused with ErrTooManyAttempts leaves with its key's attempt
// count in its metadata, under "idempotency_attempts_poisoned". Watermill's
// PoisonQueue adds the handler's name ("handler_poisoned") and publishes it.
// Republished as it is (Watermill's components/requeuer does that, or an
// operator by hand), it gets MaxAttempts more attempts, counted from that
// count. No operator needs to release its key first.
//
// The record is not touched: a key that completed meanwhile answers its
// requeued copies as duplicates. All copies of one requeue share its
// budget. A copy that spends it goes back to the poison queue with the new
// count, so a handler that still fails cannot loop through it. A
// requeuer that runs unattended grants a budget per pass: bound its passes
// (requeuer.RetriesKey), or stop it once the poison queue is empty.
//
// No other copy gets a new budget: one marked by another handler's poison
// queue, one with a count above its record's (made up), or one poisoned
// for another reason, which keeps what is left of its budget. (A key whose
// record expired starts again from one attempt anyway.) The metadata is
// trusted as the key itself is: a producer that sets both fields gets
// what a requeue gets.
//
// # Guarantees
//
//   - No message is acked unless its handler succeeded or its key is
//     COMPLETED. A store outage nacks (fail closed) and loses nothing.
//   - The handler runs at most once at a time per key, and after a success
//     never again while the COMPLETED record lives (CompletedTTL), as long as
//     the store is reachable. A live but slow handler keeps its lease; a
//     crashed consumer's key is claimable once its lease expires.
//   - Produced messages are stored with COMPLETED (up to MaxOutputSize) and
//     returned again for every duplicate, so outputs are at-least-once with
//     stable UUIDs: a publish that failed after completion is retried by the
//     redelivery, and the next hop deduplicates by the same UUIDs.
//   - Outputs larger than MaxOutputSize (1 MiB, encoded) are at most once:
//     the key is COMPLETED without them and the router publishes them once.
//     Should that publish fail, the redelivery is acked as a duplicate
//     without them, and they are lost. Such a run is counted as
//     OutcomeOutputNotStored (not OutcomeProcessed) and logged at Error
//     with ErrOutputNotStored and the output's size, so that an operator
//     raises MaxOutputSize or shrinks the output before a publish fails.
//     The middleware cannot keep the message unacked until its output is
//     published: it returns before the router publishes, and the effect has
//     happened by then, so failing or releasing the key would run it again.
//     (DisableOutputReplay makes every output at most once, by choice.)
//   - Leases and TTLs are bounded by MaxTTL (100 years): a longer one, such
//     as time.Duration(math.MaxInt64) for "forever", is an invalid config,
//     never an expiry in the past that would let a second owner claim a
//     live key.
//   - Side effects outside the store are exactly once only if they are
//     idempotent or transactional themselves: a handler that charged a card
//     and then crashed before COMPLETED was written runs again after its
//     lease. The middleware narrows that window to the crash; it cannot
//     close it. A database effect can close it: with package pgstore or
//     mysqlstore as the store, the handler writes its effect and COMPLETED in
//     one transaction (the store's CompleteInTx, through RunFromContext), so
//     they commit together or not at all, and a stale owner's transaction
//     rolls back.
//     Until that commit is known (Run.CompletedInTransaction), the run keeps
//     its lease: a failed COMMIT followed by a retry inside the handler, or
//     by Watermill's Retry inside this middleware, still holds the key.
//   - A process answers a key it saw COMPLETED from memory for up to
//     CacheTTL (1 min), without a store call; see "Cache of completed keys".
//     The one exception to the guarantee above: after an operator deletes a
//     completed key, a process that cached it may ack a copy as a duplicate
//     for up to CacheTTL more, while the others run the handler again.
//
// # Cache of completed keys
//
// COMPLETED is final until its record expires, so a process that has seen
// a key COMPLETED — it completed the key itself, or a claim found it
// completed — answers later copies of that key from memory: the
// middleware acks them with the stored output (its fingerprint compared
// as the store would, for CheckPayload), Once.Do returns the stored value,
// Once.Claim (httpidem, grpcidem) the stored record, and no command
// reaches the store. A burst of duplicates (a rebalance, a retrying
// client) then costs a map lookup instead of a round trip. An entry lives
// at most Config.CacheTTL (DefaultCacheTTL, 1 min) and never past the
// record: for a key completed here, CompletedTTL after the Complete was
// sent (the store counts its TTL from later, when the Complete reached
// it); for a record read from a claim, CompletedTTL after its UpdatedAt,
// less one second. That rests on two assumptions: every process sharing
// the store completes keys with the same CompletedTTL, and the clocks of
// the processes and the store agree within a second. A store whose claims
// leave UpdatedAt zero has its records read from claims not cached.
//
// The exception is an operator's Delete (Store.Delete, idemctl purge): it
// reaches the processes that cached the key only when their entries end,
// up to CacheTTL later; until then they ack copies of the key as
// duplicates, while the other processes run the handler again. Set
// Config.DisableCache where a deletion must be seen at once, or wait
// CacheTTL after deleting before redelivering.
//
// The cache is bounded by Config.CacheMaxBytes (DefaultCacheMaxBytes, 16
// MiB: keys, outputs and fingerprints, plus an overhead per entry), evicts
// the least recently used entries, and is sharded so that concurrent
// handlers seldom wait on one another. A store in this process (memstore)
// is never cached: it answers from memory already. What a duplicate
// returns is the caller's own copy: changing it never changes the cache.
// An Observer that is also a CacheObserver counts hits and misses
// (package idemprom: idempotency_cache_lookups_total), and CacheStats
// reports them with the evictions, entries and bytes.
//
// # Failures after the handler
//
// If COMPLETED cannot be written after the handler succeeded, the write is
// retried until the lease would expire; if it still fails, the message is
// acked anyway with its output (nacking would run the effect again), and the
// event is logged and counted as OutcomeCompleteFailed. OutcomeLeaseLost
// means the store itself said, within the lease, that the token no longer
// holds the key (another owner took it, or it was deleted). If the lease was lost while the handler ran (the store said so, or no renewal succeeded for nine
// tenths of a lease, so that the store is about to free the key), the
// handler's context is cancelled with ErrLeaseLost as its cause
// (context.Cause) before another consumer can claim the key. Renewals do not
// depend on the message's context: a subscriber that cancels it does not
// stop them while the handler runs.
//
// # Writing a store
//
// Nothing in this section is needed to use the middleware, Once or the
// adapters: it is for those who implement Store for another database.
//
// A Store implements the state machine documented on the Store interface,
// one atomic operation per transition, with expiry on the store's own
// clock. It calls CheckClaim, CheckOwner or CheckRelease before anything
// else, so that an empty key or token, or a lease or TTL that is not
// positive, is refused with ErrEmptyKey, ErrEmptyToken or ErrInvalidTTL by
// every store alike, and passes every lease and TTL through ClampTTL before
// its arithmetic, so that one beyond MaxTTL holds the key for MaxTTL
// instead of overflowing into an expiry in the past. It returns ErrLeaseLost and ErrCorruptRecord wrapped
// with the key, and passes storetest.Run, the conformance suite that every
// store of this module passes (against a real server for a networked
// store); NewToken makes owner tokens for code that calls a store
// directly, as that suite does.
//
// Renew answers ErrCompletedByOwner, not ErrLeaseLost, when the key is
// COMPLETED by the renewing token itself: the owner's lease then ends
// without cancelling its work.
//
// A store whose transactions can hold the work's own effect (package
// pgstore) may offer to write COMPLETED inside them: RunFromContext gives
// it the run's key, token, TTL and encoded result, and
// Run.CompletedInTransaction tells the owner that COMPLETED is written,
// though not yet committed. The owner keeps renewing its lease, since the
// transaction may still roll back (a failed COMMIT) while the work goes on
// (a retry), and learns the outcome from the renewals: the store's Renew
// must wait for the transaction that holds the completion, then answer
// ErrCompletedByOwner if it committed, or renew if it rolled back (a row
// lock does both). The handler's COMMIT result is the only other witness,
// and it reaches only the handler.
//
// Every store call is bounded by Config.StoreTimeout, and an owner's calls
// by what is left of its lease, through the call's context: a store must
// honour its context's deadline. (This module's in-process memstore alone
// is called without that timeout, since it never waits on I/O.)
//
// # Observability
//
// Every outcome is logged through the watermill.LoggerAdapter with the key,
// handler name, outcome and attempts, and reported to Config.Observer along
// with the latency of every store call; package idemprom exports them to
// Prometheus. An Observer that also implements ContextObserver gets each
// outcome with the message's context (msg.Context()), its stored key,
// attempt and replayed flag instead; package idemotel uses it to put them on
// the message's OpenTelemetry span, and records the same metrics as
// idemprom.
//
// Watermill's router logs every error a handler returns at Error; neither
// its RouterConfig nor its handlers have a level to set, and it leaves out
// only context.Canceled. Each copy nacked as in progress is such an error:
// a consumer that died holding a key makes one Error line per redelivery
// until its lease lapses. Give the router RouterLogger(logger) to log those
// at Debug, beside the middleware's own line for OutcomeInProgress.
package idempotency
