// Package commalist reads the comma-separated lists of the project's
// environment variables and command-line flags (BROKER_AMQP_PUBLISH_GROUPS,
// idembench's -sections, -brokers and -c) one way: items trimmed of
// spaces, empty items dropped.
package commalist
