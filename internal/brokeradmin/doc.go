// Package brokeradmin deletes what the project's tests and the idembench
// program leave on shared brokers: the JetStream streams of NATS subjects,
// and the exchanges and queues of RabbitMQ topics, named as package backends
// declares them. Each deletion opens a connection of its own, deletes what
// it can and returns every failure, joined and naming what it could not
// delete; deleting what does not exist is not an error. JetStream gives the
// tests a JetStream context on a connection of its own.
package brokeradmin
