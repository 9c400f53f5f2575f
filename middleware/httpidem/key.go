package httpidem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

var (
	errKeyEmpty    = errors.New("is empty")
	errKeyQuote    = errors.New("is not a valid quoted string")
	errKeyTooLong  = errors.New("is too long")
	errKeyNotPrint = errors.New("contains a character outside printable ASCII")
	errKeyComma    = errors.New("contains a comma outside a quoted string")
)

// parseKey returns the idempotency key carried by the header value v.
//
// The value is taken as sent (Stripe's form), except that a value starting
// with a double quote is an RFC 8941 sf-string (the IETF draft's form,
// Idempotency-Key: "8e03978e"), whose quotes and backslash escapes are
// removed; the two forms of one key are the same key. The key must be 1 to
// maxLen bytes of printable ASCII (0x20 to 0x7E). An unquoted value must not
// hold a comma: proxies may merge repeated header lines into one, joined by
// commas (RFC 9110, section 5.3), so "k1, k2" may be two keys, and taking it
// for one would make two different requests share a key. A quoted key may
// hold commas.
func parseKey(v string, maxLen int) (string, error) {
	if strings.HasPrefix(v, `"`) {
		k, ok := unquoteSFString(v)
		if !ok {
			return "", errKeyQuote
		}
		v = k
	} else if strings.IndexByte(v, ',') >= 0 {
		return "", errKeyComma
	}
	if v == "" {
		return "", errKeyEmpty
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", errKeyNotPrint
		}
	}
	if len(v) > maxLen {
		return "", errKeyTooLong
	}
	return v, nil
}

// unquoteSFString decodes an RFC 8941 sf-string: a quoted run of printable
// ASCII where only \" and \\ are escapes. Parameters are not accepted.
func unquoteSFString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v)-1 || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			return "", false
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// scopeHashLen is how many bytes of the scope's SHA-256 name it in a stored
// key: 128 bits, so that two scopes meet only by a collision no one can
// find (2^64 scopes for an even chance), while keys stay short.
const scopeHashLen = 16

// storeKey returns the stored key of (scope, key): the prefix, the hex of
// the first 16 bytes of SHA-256(scope), a colon and the key, as in
// "httpidem:2bd806c97f0e00af1a1fc3328fa763a9:k1" for scope "alice". The
// scope is hashed so that no secret (an API key used as the scope) appears
// in a key name, in the store's logs or in a SCAN. Its hash has a fixed
// length, so no two (scope, key) pairs share a stored key, whatever bytes
// they hold.
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

// fingerprint identifies the request a key was first used for: SHA-256 over
// the method, the escaped path, the raw query and the SHA-256 of the body,
// each length-prefixed so that no two requests share an input.
func fingerprint(r *http.Request, body []byte) []byte {
	bodySum := sha256.Sum256(body)
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	field := func(s []byte) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write(s)
	}
	h.Write([]byte{fingerprintVersion})
	field([]byte(r.Method))
	field([]byte(r.URL.EscapedPath()))
	field([]byte(r.URL.RawQuery))
	field(bodySum[:])
	return h.Sum(nil)
}

// describeKeyError says what is wrong with a key, for a problem detail.
func describeKeyError(header string, maxLen int, err error) string {
	switch {
	case errors.Is(err, errKeyTooLong):
		return fmt.Sprintf("The %s header is longer than %d bytes.", header, maxLen)
	case errors.Is(err, errKeyNotPrint):
		return fmt.Sprintf("The %s header must hold printable ASCII characters only (0x20 to 0x7E).", header)
	case errors.Is(err, errKeyQuote):
		return fmt.Sprintf("The %s header starts with a double quote but is not a valid quoted string.", header)
	case errors.Is(err, errKeyComma):
		return fmt.Sprintf("The %s header holds a comma, which may join two header lines: send the key once, and quote it (\"a,b\") if the comma is part of it.", header)
	default:
		return fmt.Sprintf("The %s header is empty.", header)
	}
}
