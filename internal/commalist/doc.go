// Package commalist reads the comma-separated lists of the project's
// settings and command-line flags (an AMQP broker URL's publish_groups,
// idembench's -sections, -brokers and -c) one way: items trimmed of
// spaces, empty items dropped.
package commalist
