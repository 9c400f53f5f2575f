// Package killtest holds the harness of the SQL stores' kill tests
// (TestKillConsumerProcess of pgstore and mysqlstore): a consumer process
// under the idempotency middleware, on Redis Streams, is SIGKILLed in each
// window of a message's handling and restarted, and the test counts the
// effects it left, one row per run of the handler. Only tests import it.
//
// A store's test keeps what is its own: the store, the effects table and
// how the handler commits its effect (in the store's transaction, or on its
// own). The consumer is the test binary re-executed: the test's TestMain
// calls ConsumerFromEnv and, in a consumer, runs Consume instead of the
// tests.
//
// The windows, announced by the consumer on its stdout as "<phase> <key>"
// when it enters them, are PhaseStart (claimed, effect not made),
// PhaseEffect (effect made, not committed) and PhaseCommitted (effect and
// COMPLETED committed, message not acked). A kill is counted in the last
// window the consumer announced before it died.
package killtest
