// Package testserver finds and starts the real servers that the project's
// integration and end-to-end tests run against.
//
// Shared servers (Redis, RabbitMQ, NATS, Kafka) are found from environment
// variables with localhost defaults. A server that does not answer fails the
// test: service-backed tests never skip silently. The only way to leave them
// out is `go test -short`, which every helper here turns into an explicit
// t.Skip naming the server.
//
// Private servers (a redis-server to stop and restart, a 3-master Redis
// Cluster) are started on free loopback ports from the redis-server binary on
// PATH and torn down by t.Cleanup.
package testserver
