// Package adapterinspect lets idemctl read the keys and records of the
// request/response adapters (httpidem, grpcidem) with the adapters' own
// code: each adapter registers, when it is linked in, how it derives a
// stored key from a client's key and what one of its stored answers holds.
// Nothing here knows a key layout or a record format.
package adapterinspect

import "sort"

// Answer is what a COMPLETED key of an adapter holds, as an operator reads
// it. Only the fields of its Format are set.
type Answer struct {
	// Format: "http_response" (httpidem), "grpc_response",
	// "grpc_status" (a final error status) or "grpc_not_stored" (larger
	// than MaxResponseSize) (grpcidem).
	Format string `json:"-"`
	// Status, Headers, BodyBytes and BodyStored are an HTTP response's:
	// BodyBytes is its body's size, and BodyStored false when the body was
	// larger than MaxResponseBody and only its size was kept.
	Status     int                 `json:"status,omitempty"`
	Headers    map[string][]string `json:"headers,omitempty"`
	BodyBytes  *int64              `json:"body_bytes,omitempty"`
	BodyStored *bool               `json:"body_stored,omitempty"`
	// Type is a gRPC response's message full name, and Bytes its size in
	// wire format (for grpc_not_stored, the size that was not stored).
	Type  string `json:"type,omitempty"`
	Bytes *int   `json:"bytes,omitempty"`
	// Code and Message are a gRPC status's.
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// Adapter is one adapter's reading of its keys and records.
type Adapter struct {
	Name          string // "http" or "grpc"
	DefaultPrefix string // its Config.KeyPrefix when empty
	// ClientKey is the key the adapter reads from what a client sent (a
	// quoted Idempotency-Key unquoted), or why it refuses it.
	ClientKey func(sent string) (string, error)
	// StoreKey is the stored key of a client's key in a scope, under
	// prefix: the adapter's own derivation.
	StoreKey func(prefix, scope, key string) string
	// Describe decodes a stored answer, strictly: a record the adapter did
	// not write is an error.
	Describe func(result []byte) (Answer, error)
}

var adapters = map[string]Adapter{}

// Register adds a; adapters call it from init.
func Register(a Adapter) { adapters[a.Name] = a }

// All returns the registered adapters by name.
func All() []Adapter {
	out := make([]Adapter, 0, len(adapters))
	for _, a := range adapters {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
