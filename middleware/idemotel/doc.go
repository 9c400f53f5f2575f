// Package idemotel reports the outcomes of [idempotency.Once] to
// OpenTelemetry: as attributes on the span of the message or request, and as
// metrics named and labelled as package idemprom's. The core does not
// depend on OpenTelemetry.
//
//	obs, err := idemotel.New(idemotel.Config{}) // the global MeterProvider
//	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store, Observer: obs})
//
// One [Observer] serves every adapter built on that Once.
//
// # Traces
//
// [Observer.Outcome] sets these attributes on the recording span of the
// outcome's context; it starts no span of its own:
//
//   - idempotency.key_hash: the hex SHA-256 of the stored key, never the
//     key itself. It is pgstore's key_hash column. Absent for missing_key.
//   - idempotency.scope: the Watermill handler, HTTP route, gRPC method, or
//     "once" for Once.Do.
//   - idempotency.outcome: an [idempotency.Outcome] (processed, duplicate, …).
//   - idempotency.attempt: the key's attempt count, when a record was read.
//   - idempotency.replayed: true for a duplicate answered from the store.
//
// The span is the one the context carries: a Watermill tracing middleware's
// (added before this one), otelhttp's, otelgrpc's, or Once.Do's caller's.
// Without a recording span only the metrics are recorded.
//
// # Metrics
//
// From [Config.MeterProvider]'s meter named after this package, with
// idemprom's names (and Namespace prefix) and attributes:
//
//   - idempotency_outcomes_total, Int64Counter "{delivery}": handler, outcome.
//   - idempotency_store_duration_seconds, Float64Histogram "s": op, result;
//     idemprom's buckets.
//   - idempotency_cache_lookups_total, Int64Counter "{lookup}": handler,
//     result (hit, miss).
//
// An exporter that keeps names as they are yields the series that
// dashboards/ queries; configure one that adds suffixes not to. Package
// idemprom says what to alert on.
package idemotel
