package adapter

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
)

// ScopeHashLen is how many bytes of the scope's SHA-256 name it in a stored
// key: 128 bits, so that two scopes meet only by a collision no one can
// find (2^64 scopes for an even chance), while keys stay short.
const ScopeHashLen = 16

// What is wrong with a client's key; the adapter says where the key was.
var (
	ErrKeyEmpty        = errors.New("is empty")
	ErrKeyTooLong      = errors.New("is too long")
	ErrKeyNotPrintable = errors.New("holds a byte outside printable ASCII")
)

// CheckKey accepts a client's key of 1 to maxLen bytes of printable ASCII
// (0x20 to 0x7E), the rule of every adapter.
func CheckKey(k string, maxLen int) error {
	if k == "" {
		return ErrKeyEmpty
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return ErrKeyNotPrintable
		}
	}
	if len(k) > maxLen {
		return ErrKeyTooLong
	}
	return nil
}

// StoreKey returns the stored key of (scope, key): the prefix, a colon, the
// hex of the first 16 bytes of SHA-256(scope), a colon and the key, as in
// "httpidem:2bd806c97f0e00af1a1fc3328fa763a9:k1" for prefix "httpidem" and
// scope "alice". The scope is hashed so that no secret (an API key used as
// the scope) appears in a key name, in the store's logs or in a SCAN. Its
// hash has a fixed length, so no two (scope, key) pairs share a stored key,
// whatever bytes they hold.
func StoreKey(prefix, scope, key string) string {
	sum := sha256.Sum256([]byte(scope))
	b := make([]byte, 0, len(prefix)+1+2*ScopeHashLen+1+len(key))
	b = append(b, prefix...)
	b = append(b, ':')
	b = hex.AppendEncode(b, sum[:ScopeHashLen])
	b = append(b, ':')
	b = append(b, key...)
	return string(b)
}

// ForwardKey returns the key a handler forwards when it hands its work on:
// the stored key skey without its prefix, so the scope's hash, a colon and
// the key.
func ForwardKey(prefix, skey string) string { return strings.TrimPrefix(skey, prefix+":") }

// Fingerprint returns the SHA-256 of version followed by each field,
// length-prefixed (uvarint) so that no two lists of fields share an input.
// An adapter changes its version whenever its fields change, so that
// records of an older version never match by accident.
func Fingerprint(version byte, fields ...[]byte) []byte {
	h := sha256.New()
	h.Write([]byte{version})
	var n [binary.MaxVarintLen64]byte
	for _, f := range fields {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		h.Write(f)
	}
	return h.Sum(nil)
}
