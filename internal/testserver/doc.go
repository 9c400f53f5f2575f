// Package testserver finds and starts the real servers that the project's
// integration and end-to-end tests run against.
//
// Shared servers (Redis, RabbitMQ, NATS, Kafka) are found from environment
// variables with localhost defaults. A server that does not answer fails the
// test: service-backed tests never skip silently. The only way to leave them
// out is `go test -short`, which every helper here turns into an explicit
// t.Skip naming the server.
//
// Private servers are started on free loopback ports, so that restarting
// one disturbs no other test, and torn down by t.Cleanup: a redis-server to
// stop and restart, a 3-master Redis Cluster, a Sentinel set (master,
// replica, three sentinels) from the redis-server binary on PATH; a
// nats-server with JetStream; a RabbitMQ node of its own beside the shared
// one; an in-process Kafka that keeps its data across a restart.
// RestartCommand lets Watermill's TestReconnect restart them.
//
// Two loopback proxies inject network faults: Proxy understands RESP and
// drops the reply of a chosen Redis command (a lost reply); FaultProxy
// carries any TCP protocol and adds latency, stalls connections, resets
// them in the middle of a reply, and partitions the client side from the
// server.
package testserver
