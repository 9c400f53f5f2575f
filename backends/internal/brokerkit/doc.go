// Package brokerkit holds what package backends and its broker packages
// share and no user needs: the registry of brokers, the parameters of a
// broker URL, the nack delay that keeps a failing message from spinning,
// the per-process record of topics set up on a broker, and the closed state
// of a subscriber that relays messages itself.
//
// It imports no broker client library, so that package backends links none.
package brokerkit
