package adapter

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
)

// MaxKeyLength is the longest key stored as given, in bytes. A longer key,
// or one that starts with "sha256:", is stored as "sha256:" and its hex
// SHA-256. No adapter refuses a key for its length.
const MaxKeyLength = 200

// ScopeHashLen is how many bytes of the scope's SHA-256 name it in a stored
// key: 128 bits, 2^64 scopes for an even chance of a collision.
const ScopeHashLen = 16

const hashedKeyPrefix = "sha256:"

// What is wrong with a client's key; the adapter says where the key was.
var (
	ErrKeyEmpty        = errors.New("is empty")
	ErrKeyNotPrintable = errors.New("holds a byte outside printable ASCII")
)

// CheckKey accepts a client's key of printable ASCII (0x20 to 0x7E), not
// empty: the rule of the HTTP and gRPC adapters.
func CheckKey(k string) error {
	if k == "" {
		return ErrKeyEmpty
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return ErrKeyNotPrintable
		}
	}
	return nil
}

// StoreKey returns the stored key of (scope, key): the prefix, a colon, the
// scope, a colon and the key, hashed as MaxKeyLength says. With hashScope
// the scope is the hex of ScopeHashLen bytes of its SHA-256, so no secret
// appears in a key name; else its colons and percent signs are escaped.
func StoreKey(prefix, scope, key string, hashScope bool) string {
	if len(key) > MaxKeyLength || strings.HasPrefix(key, hashedKeyPrefix) {
		sum := sha256.Sum256([]byte(key))
		key = hashedKeyPrefix + hex.EncodeToString(sum[:])
	}
	var b strings.Builder
	switch {
	case hashScope:
		sum := sha256.Sum256([]byte(scope))
		var h [2 * ScopeHashLen]byte
		hex.Encode(h[:], sum[:ScopeHashLen])
		b.Grow(len(prefix) + 2 + len(h) + len(key))
		b.WriteString(prefix)
		b.WriteByte(':')
		b.Write(h[:])
	default:
		if strings.ContainsAny(scope, "%:") {
			scope = scopeEscaper.Replace(scope)
		}
		b.Grow(len(prefix) + 2 + len(scope) + len(key))
		b.WriteString(prefix)
		b.WriteByte(':')
		b.WriteString(scope)
	}
	b.WriteByte(':')
	b.WriteString(key)
	return b.String()
}

var scopeEscaper = strings.NewReplacer("%", "%25", ":", "%3A")

// ForwardKey returns the stored key skey without its prefix: the key a
// handler forwards with its work.
func ForwardKey(prefix, skey string) string { return strings.TrimPrefix(skey, prefix+":") }

// Fingerprint returns the SHA-256 of version and each field, length-prefixed
// so that no two lists of fields share an input. An adapter changes its
// version whenever its fields change.
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
