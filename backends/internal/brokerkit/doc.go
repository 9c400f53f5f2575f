// Package brokerkit holds what the broker packages of package backends
// share and no user needs: the nack delay that keeps a failing message from
// spinning, the per-process record of topics set up on a broker, the closed
// state of a subscriber that relays messages itself, and the parsing of a
// broker URL that is a list of hosts.
//
// It imports no broker client library, so that package backends, which
// uses it for gochannel, links none.
package brokerkit
