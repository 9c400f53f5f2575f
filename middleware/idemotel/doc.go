// Package idemotel reports the idempotency middleware's outcomes to
// OpenTelemetry: as attributes on the span of the message or request, and as
// metrics with the same names and labels as package idemprom. It lives apart
// so that the middleware itself does not depend on OpenTelemetry.
//
//	obs, err := idemotel.New(idemotel.Config{}) // the global MeterProvider
//	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs})
//
// One Observer serves every adapter built on that [idempotency.Once].
//
// # Traces
//
// The protocol hands [Observer.Outcome] every outcome with the context of
// its message (msg.Context() as the handler received it), its request
// (HTTP) or its call (Once.Do). Observer puts these attributes on the span
// that context carries, if that span is recording; it starts no span of its
// own:
//
//   - idempotency.key_hash (string): the lower-case hex SHA-256 of the
//     stored key (for Watermill prefix:scope:key). The key itself may carry
//     user data and is never exported; the hash is also the key_hash column
//     of a pgstore table, and `printf %s "$KEY" | sha256sum` gives it for a
//     key seen with idemctl. Absent when no key could be derived
//     (missing_key).
//   - idempotency.scope (string): the Watermill handler's name (the
//     scope of the stored key), the HTTP route pattern (or "http"), the
//     gRPC method, or "once" for Once.Do. Never a tenant's identity.
//   - idempotency.outcome (string): an idempotency.Outcome (processed,
//     duplicate, handler_failed, in_progress, …).
//   - idempotency.attempt (int): the key's attempt count as the claim read
//     it: the number of this run when the handler ran, the stored count when
//     it did not. Absent when no record was read (missing_key,
//     store_unavailable, caller_gone).
//   - idempotency.replayed (bool): true when the stored result was returned
//     instead of running the handler (outcome duplicate).
//
// The span is whichever one the context carries, so the attributes land on:
//   - the consumer span of a Watermill message, when a tracing middleware
//     that runs before this one (router.AddMiddleware order) or the
//     subscriber put it into msg.Context() — Watermill's usual context
//     propagation;
//   - the server span of otelhttp.NewHandler around an httpidem middleware;
//   - the server span of otelgrpc's stats handler around a grpcidem
//     interceptor;
//   - the caller's span for Once.Do.
//
// With no span in the context (or a span that is not recording) only the
// metrics are recorded.
//
// # Metrics
//
// Instruments, from Config.MeterProvider's meter named after this package's
// import path, with the
// names and attributes of idemprom's series (Namespace, when set, is
// prepended with an underscore, as idemprom does):
//   - idempotency_outcomes_total, an Int64Counter, unit "{delivery}",
//     attributes handler and outcome: one per delivery or request, with the
//     same values as idempotency_outcomes_total{handler, outcome} of
//     idemprom;
//   - idempotency_store_duration_seconds, a Float64Histogram, unit "s",
//     attributes op (claim, renew, complete, fail, release) and result (ok,
//     error), with idemprom's bucket boundaries;
//   - idempotency_cache_lookups_total, an Int64Counter, unit "{lookup}",
//     attributes handler and result (hit, miss): one per claim while the
//     cache of completed keys is on, as idemprom counts them.
//
// An exporter that keeps instrument names as they are (OTLP into a
// Prometheus that does not add suffixes, for one) therefore yields the very
// series the dashboard in dashboards/ queries. An exporter that appends unit
// or type suffixes may rename them; configure it not to.
//
// Alert on complete_failed and lease_lost (a handler may run twice),
// output_not_stored (an output larger than MaxOutputSize was not stored,
// and is lost if its publish fails), store_unavailable (messages are
// nacked), and a growing rate of in_progress (handlers slower than the
// broker's redelivery); not on caller_gone (an HTTP, gRPC or Once.Do
// caller gave up before the store answered).
package idemotel
