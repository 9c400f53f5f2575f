// Package testpb is the service that the tests of package grpcidem call
// over a real gRPC connection. Regenerate it with go generate (protoc from
// Debian's protobuf-compiler; the plugins from the Go module proxy:
// google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12 and
// google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2).
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative ledger.proto
