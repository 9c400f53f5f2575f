package httpidem

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// What is wrong with a key: the rules every adapter shares, and two of
// the header's own.
var (
	errKeyEmpty    = adapter.ErrKeyEmpty
	errKeyNotPrint = adapter.ErrKeyNotPrintable
	errKeyQuote    = errors.New("is not a valid quoted string")
	errKeyComma    = errors.New("contains a comma outside a quoted string")
)

// parseKey returns the idempotency key carried by the header value v.
//
// The value is taken as sent (Stripe's form), except that a value starting
// with a double quote is an RFC 8941 sf-string (the IETF draft's form,
// Idempotency-Key: "8e03978e"), whose quotes and backslash escapes are
// removed; the two forms of one key are the same key. The key must be
// printable ASCII (0x20 to 0x7E), not empty; a long one is hashed
// (adapter.StoreKey). An unquoted value must not
// hold a comma: proxies may merge repeated header lines into one, joined by
// commas (RFC 9110, section 5.3), so "k1, k2" may be two keys, and taking it
// for one would make two different requests share a key. A quoted key may
// hold commas.
func parseKey(v string) (string, error) {
	if strings.HasPrefix(v, `"`) {
		k, ok := unquoteSFString(v)
		if !ok {
			return "", errKeyQuote
		}
		v = k
	} else if strings.IndexByte(v, ',') >= 0 {
		return "", errKeyComma
	}
	if err := adapter.CheckKey(v); err != nil {
		return "", err
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

// fingerprintVersion changes whenever the fingerprint's input changes, so
// that records of an older version never match by accident.
const fingerprintVersion = 1

// fingerprint identifies the request a key was first used for: SHA-256 over
// the method, the escaped path, the raw query and the SHA-256 of the body,
// each length-prefixed so that no two requests share an input.
func fingerprint(r *http.Request, body []byte) []byte {
	bodySum := sha256.Sum256(body)
	return adapter.Fingerprint(fingerprintVersion, []byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery), bodySum[:])
}

// describeKeyError says what is wrong with a key, for a problem detail.
func describeKeyError(header string, err error) string {
	switch {
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
