package httpidem

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

var (
	errKeyEmpty    = errors.New("is empty")
	errKeyQuote    = errors.New("is not a valid quoted string")
	errKeyTooLong  = errors.New("is too long")
	errKeyNotPrint = errors.New("contains a character outside printable ASCII")
)

// parseKey returns the idempotency key carried by the header value v.
//
// The value is taken as sent (Stripe's form), except that a value starting
// with a double quote is an RFC 8941 sf-string (the IETF draft's form,
// Idempotency-Key: "8e03978e"), whose quotes and backslash escapes are
// removed; the two forms of one key are the same key. The key must be 1 to
// maxLen bytes of printable ASCII (0x20 to 0x7E).
func parseKey(v string, maxLen int) (string, error) {
	if strings.HasPrefix(v, `"`) {
		k, ok := unquoteSFString(v)
		if !ok {
			return "", errKeyQuote
		}
		v = k
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

// storeKey joins prefix, scope and key so that no two (scope, key) pairs
// share a stored key: the scope is preceded by its length, so scope "a:b"
// with key "c" ("3:a:b:c") and scope "a" with key "b:c" ("1:a:b:c") differ.
func storeKey(prefix, scope, key string) string {
	var b strings.Builder
	b.Grow(len(prefix) + 22 + len(scope) + len(key))
	b.WriteString(prefix)
	b.WriteString(strconv.Itoa(len(scope)))
	b.WriteByte(':')
	b.WriteString(scope)
	b.WriteByte(':')
	b.WriteString(key)
	return b.String()
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
	default:
		return fmt.Sprintf("The %s header is empty.", header)
	}
}
