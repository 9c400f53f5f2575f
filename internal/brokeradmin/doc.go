// Package brokeradmin deletes what the project's tests and the idembench
// program leave on shared brokers: the JetStream streams of NATS subjects,
// and the exchanges and queues of RabbitMQ topics, named as package backends
// declares them. Each function opens a connection of its own, deletes what it
// can, and returns the first error; deleting what does not exist is not an
// error.
package brokeradmin
