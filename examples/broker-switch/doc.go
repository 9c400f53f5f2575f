// Command broker-switch runs the same idempotent consumer on whichever broker
// BROKER_URL names; nothing else changes between brokers.
//
//	BROKER_URL=gochannel://                          go run ./examples/broker-switch
//	BROKER_URL=kafka://localhost:9092                go run ./examples/broker-switch
//	BROKER_URL=redis://localhost:6379/0              go run ./examples/broker-switch
//	BROKER_URL=amqp://guest:guest@localhost:5672/    go run ./examples/broker-switch
//	BROKER_URL=nats://localhost:4222                 go run ./examples/broker-switch
//
// BROKER_URL defaults to gochannel:// and BROKER_GROUP to "broker-switch";
// see backends.FromEnv for the other BROKER_* variables. The idempotency store
// is Redis when REDIS_URL is set (redis://localhost:6379/0), and in memory
// otherwise.
//
// The program publishes ORDERS orders (default 50), each three times, to a
// topic of its own run, consumes them through the idempotency middleware,
// and prints one line:
//
//	broker=kafka deliveries=150 processed=50 duplicates=100 effects=50 exactly-once=true
package main
