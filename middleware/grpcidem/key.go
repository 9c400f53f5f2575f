package grpcidem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var (
	errKeyEmpty    = errors.New("is empty")
	errKeyTooLong  = errors.New("is too long")
	errKeyNotPrint = errors.New("holds a byte outside printable ASCII")
	errKeyRepeated = errors.New("is sent more than once")
	errKeyConflict = errors.New("differs between the metadata and the request message")
)

// keyError says which source of the key is wrong, and how.
type keyError struct {
	source string // "metadata key-name" or "request field name"
	err    error
}

func (e *keyError) Error() string {
	return fmt.Sprintf("the idempotency key in %s %v", e.source, e.err)
}
func (e *keyError) Unwrap() error { return e.err }

// extractKey returns the call's idempotency key, from md under any of names
// or from the string field named field of req. It returns "" and nil when
// neither carries one.
//
// A metadata key may appear once, with one value; several configured names
// must agree, and so must the metadata and the request field when both
// carry a key. The key must be 1 to maxLen bytes of printable ASCII (0x20
// to 0x7E), as in package httpidem. An empty field is absent (proto3 has no
// other way to leave it out); an empty metadata value is an invalid key.
func extractKey(md metadata.MD, names []string, req proto.Message, field string, maxLen int) (string, error) {
	key, from := "", ""
	for _, name := range names {
		values := md.Get(name)
		switch {
		case len(values) == 0:
			continue
		case len(values) > 1:
			return "", &keyError{"metadata " + name, errKeyRepeated}
		}
		if err := checkKey(values[0], maxLen); err != nil {
			return "", &keyError{"metadata " + name, err}
		}
		if from != "" && values[0] != key {
			return "", &keyError{"metadata " + name, fmt.Errorf("differs from the one in %s", from)}
		}
		key, from = values[0], "metadata "+name
	}
	if v, ok := fieldKey(req, field); ok && v != "" {
		if err := checkKey(v, maxLen); err != nil {
			return "", &keyError{"request field " + field, err}
		}
		if from != "" && v != key {
			return "", &keyError{"request field " + field, errKeyConflict}
		}
		key = v
	}
	return key, nil
}

// fieldKey returns the value of req's singular string field named field,
// and whether req has such a field.
func fieldKey(req proto.Message, field string) (string, bool) {
	if req == nil {
		return "", false
	}
	m := req.ProtoReflect()
	if !m.IsValid() {
		return "", false
	}
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(field))
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
		return "", false
	}
	return m.Get(fd).String(), true
}

// checkKey accepts 1 to maxLen bytes of printable ASCII.
func checkKey(k string, maxLen int) error {
	if k == "" {
		return errKeyEmpty
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return errKeyNotPrint
		}
	}
	if len(k) > maxLen {
		return errKeyTooLong
	}
	return nil
}

// scopeHashLen is how many bytes of the scope's SHA-256 name it in a stored
// key: 128 bits, as in package httpidem.
const scopeHashLen = 16

// storeKey returns the stored key of (scope, key): the prefix, the hex of
// the first 16 bytes of SHA-256(scope), a colon and the key, as in
// "grpcidem:2bd806c97f0e00af1a1fc3328fa763a9:k1" for scope "alice". No
// secret used as a scope appears in a key name, and, the hash having a
// fixed length, no two (scope, key) pairs share a stored key.
func storeKey(prefix, scope, key string) string {
	sum := sha256.Sum256([]byte(scope))
	b := make([]byte, 0, len(prefix)+2*scopeHashLen+1+len(key))
	b = append(b, prefix...)
	b = hex.AppendEncode(b, sum[:scopeHashLen])
	b = append(b, ':')
	b = append(b, key...)
	return string(b)
}

// fingerprintVersion changes whenever the fingerprint's input changes, so
// that records of an older version never match by accident.
const fingerprintVersion = 1

// fingerprint identifies the call a key was first used for: SHA-256 over
// the full method name and the request's deterministic wire encoding
// (proto.MarshalOptions{Deterministic: true}: map entries sorted), each
// length-prefixed. Two calls of one method whose messages are equal have
// the same fingerprint in one binary; unknown fields count as sent.
func fingerprint(method string, req proto.Message) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	field := func(s []byte) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write(s)
	}
	h.Write([]byte{fingerprintVersion})
	field([]byte(method))
	field(body)
	return h.Sum(nil), nil
}
