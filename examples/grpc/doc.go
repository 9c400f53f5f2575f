// Command grpc is a small Payments service whose CreatePayment is made
// idempotent by the gRPC interceptor (package grpcidem): a client that
// retries after a timeout, or whose retry policy resends a call whose
// answer was lost, is never charged twice.
//
//	go run ./examples/grpc                                    # in-memory store
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/grpc  # shared Redis store
//
// It listens on ADDR (default 127.0.0.1:50051), with server reflection on,
// so grpcurl can call it without the .proto file. Every call needs the
// metadata "authorization: Bearer <api key>"; the API key is the
// idempotency scope, so two clients may use the same request_id without
// meeting. See README.md for a grpcurl session.
package main
